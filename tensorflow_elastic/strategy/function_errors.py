"""A failed function's error, passed on at once when the elastic loop recovers from it.

When a `tf.function` call fails, TensorFlow rewrites the error's message with the stack
that created each node the message names: it reads the debug information of the whole
function first, about 10 ms per 1,000 nodes (20-50 ms for a Keras train function), before
the error reaches Python. The elastic loop recovers from a collective's failure (a lost
peer, an aborted generation) without showing it, so its recovery need not wait for that; the
error it chains when it gives up (re-forms without progress) then lacks the node's stack.
Every other error, and every error outside training, keeps its annotated message.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from tensorflow.python.eager.polymorphic_function import atomic_function

from tensorflow_elastic.strategy import cluster
from tensorflow_elastic.tf_internals import require

_installed_lock = threading.Lock()
_recovering: Callable[[], bool] | None = None


def pass_recoverable_errors_at_once(recovering: Callable[[], bool]) -> None:
    """From now on a function's error that `cluster.is_recoverable` accepts reaches Python
    unannotated while `recovering()` (the elastic loop is training: it recovers from them)."""
    global _recovering
    with _installed_lock:
        if _recovering is None:
            annotator = atomic_function.InterpolateRuntimeError
            require(annotator, "__exit__")
            annotate = annotator.__exit__

            def __exit__(self: Any, typ: Any, exc: BaseException | None, tb: Any) -> bool:
                if exc is not None and cluster.is_recoverable(exc) and _recovering():
                    return False  # raised as it is
                return annotate(self, typ, exc, tb)

            annotator.__exit__ = __exit__
        _recovering = recovering
