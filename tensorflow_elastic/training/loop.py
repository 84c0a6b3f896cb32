"""`tensorflow_elastic.run`: run a training function until it finishes, re-forming around failures.

The loop itself is the runtime's (`ElasticRuntime.train` in strategy/runtime.py):
it owns every step of a membership change.
"""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

from tensorflow_elastic.strategy import runtime as runtime_lib
from tensorflow_elastic.training.state import State

T = TypeVar("T")


def run(func: Callable[..., T]) -> Callable[..., T]:
    """Decorates `func(state, ...)`: sync, call, and on a fault restore, re-form, retry."""

    @functools.wraps(func)
    def wrapper(state: State, *args, **kwargs) -> T:
        return runtime_lib.current().train(state, lambda: func(state, *args, **kwargs))

    return wrapper
