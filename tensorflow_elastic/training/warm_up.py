"""A newcomer's warm-up: its step traced and run once, alone, before it asks to join.

A node that arrives while the job runs registers without joining (a standby
node, alone in a world of one). What its first step would cost beyond the step
itself (tracing, TensorFlow's optimization and instantiation of the traced
graph, the first run's allocations) is then paid while the members keep
training, so that joining costs them only the re-form and the state transfer.
What the warm-up step changes in the state is replaced by the state sync that
admits the node (it takes every variable and value of the member furthest
ahead).
"""

from __future__ import annotations

from typing import Any, Callable

from tensorflow_elastic.strategy import runtime as runtime_lib


def joining() -> bool:
    """Whether this process is a node that will join a running job when it starts training."""
    runtime = runtime_lib.current_or_none()
    return runtime is not None and runtime.session.standby


def warm_up(step: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
    """On a node joining a running job: calls `step(*args, **kwargs)` once, now, before it
    joins; elsewhere does nothing. Returns whether it ran.

    Call it after building the model and before the `tensorflow_elastic.run`
    function, with arguments of the types and shapes the training's steps pass
    (a batch of the node's own data), so that the first step in the job runs
    the traced function as it is.
    """
    if not joining():
        return False
    step(*args, **kwargs)
    return True
