"""The PS's copy of the model: variables, optimizer, and versioned snapshots for pulls.

Applying an update and reading a snapshot take the same lock, so a pull
never sees half an update; a snapshot is encoded once per version and shared
by every worker that pulls it.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from tensorflow_elastic.proto import parameter_server_pb2 as pb
from tensorflow_elastic.ps import tensors


def variable_specs(variables: Sequence[Any]) -> list[pb.VariableSpec]:
    return [pb.VariableSpec(name=getattr(v, "path", None) or v.name,
                            dtype=np.dtype(tf.as_dtype(v.dtype).as_numpy_dtype).name,
                            shape=[int(d) for d in v.shape])
            for v in variables]


class Parameters:
    """Variables and optimizer of the model being trained, at a version."""

    def __init__(self, variables: Sequence[Any], optimizer: Any, version: int = 0):
        if not variables:
            raise ValueError("the parameter server needs at least one variable to train")
        self.variables = list(variables)
        self.optimizer = optimizer
        self.specs = variable_specs(self.variables)
        self._dtypes = [np.dtype(s.dtype) for s in self.specs]
        self._shapes = [tuple(s.shape) for s in self.specs]
        self._version = version
        self._changed = threading.Condition()
        self._lock = threading.Lock()
        self._snapshot: tuple[int, list[tensors.Raw]] | None = None
        if hasattr(optimizer, "build"):
            optimizer.build(self.variables)
        signature = [tf.TensorSpec(shape, tf.as_dtype(dtype))
                     for shape, dtype in zip(self._shapes, self._dtypes)]
        self._apply_fn = tf.function(self._apply_gradients, input_signature=[signature])

    def _apply_gradients(self, gradients: list[tf.Tensor]) -> None:
        self.optimizer.apply_gradients(zip(gradients, self.variables))

    @property
    def version(self) -> int:
        return self._version

    def check(self, arrays: Sequence[np.ndarray]) -> None:
        """ValueError naming the first gradient that does not fit its variable."""
        if len(arrays) != len(self.specs):
            raise ValueError(f"expected {len(self.specs)} gradients (one per variable), "
                             f"got {len(arrays)}")
        for spec, shape, dtype, array in zip(self.specs, self._shapes, self._dtypes, arrays):
            if array.shape != shape or array.dtype != dtype:
                raise ValueError(f"gradient for {spec.name} is {array.dtype.name}{list(array.shape)}"
                                 f", the variable is {dtype.name}{list(shape)}")

    def apply(self, arrays: Sequence[np.ndarray], version: int) -> None:
        """Applies one aggregated gradient; ``version`` is the version it produces."""
        with self._lock:
            self._apply_fn(list(arrays))
            self._version = version
        with self._changed:
            self._changed.notify_all()

    def set_version(self, version: int) -> None:
        with self._lock:
            self._version = version

    def arrays(self) -> tuple[int, list[np.ndarray]]:
        with self._lock:
            return self._version, [np.asarray(v.numpy()) for v in self.variables]

    def snapshot(self) -> tuple[int, list[tensors.Raw]]:
        """The current version and its raw parameters (read once per version)."""
        cached = self._snapshot
        if cached is not None and cached[0] == self._version:
            return cached
        version, arrays = self.arrays()
        snapshot = (version, [tensors.raw(a) for a in arrays])
        self._snapshot = snapshot
        return snapshot

    def wait_for(self, version: int, timeout: float, stopped: threading.Event) -> None:
        """Returns when the version reaches ``version``, the PS stops, or ``timeout`` passes."""
        with self._changed:
            self._changed.wait_for(lambda: self._version >= version or stopped.is_set(),
                                   timeout=timeout)

    def wake_waiters(self) -> None:
        with self._changed:
            self._changed.notify_all()
