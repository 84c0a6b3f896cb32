"""Snapshots of variables that a commit takes at every step without an eager op.

A state's commit runs after every training step. Reading its variables with an
eager op (even one `_ReadVariablesOp` for all of them) costs 50-250 us of op
dispatch per commit in TensorFlow 2.21 (measured in running workers: every
eager op runs as a function), several percent of a 10 ms step. Here an op run
once pins the variables in C++; each commit is then one C call (ctypes) that
takes a reference to every variable's buffer. Nothing is copied at the commit:
the next in-place update copies the buffer instead (copy-on-write), exactly as
when a read of the variable is still alive.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from typing import Sequence

import tensorflow as tf

from tensorflow_elastic.ops import LIBRARY_PATH, load_op_library

_lock = threading.Lock()
_c_api: ctypes.PyDLL | None = None


class SnapshotError(RuntimeError):
    """A snapshot call failed (unknown snapshot, uninitialized variable, wrong dtype)."""


def _library() -> ctypes.PyDLL:
    """The op library's C functions (the library TensorFlow loaded, so the same snapshots)."""
    global _c_api
    with _lock:
        if _c_api is None:
            load_op_library()
            # PyDLL keeps the GIL: every call is a few microseconds.
            c_api = ctypes.PyDLL(LIBRARY_PATH)
            c_api.TfeVariableSnapshotTake.argtypes = [ctypes.c_int64]
            c_api.TfeVariableSnapshotReadFloat64.argtypes = [
                ctypes.c_int64, ctypes.c_int, ctypes.POINTER(ctypes.c_double), ctypes.c_int64]
            c_api.TfeVariableSnapshotRelease.argtypes = [ctypes.c_int64]
            c_api.TfeVariableSnapshotLastError.restype = ctypes.c_char_p
            _c_api = c_api
        return _c_api


def _check(status: int) -> None:
    if status != 0:
        raise SnapshotError(_library().TfeVariableSnapshotLastError().decode())


class VariableSnapshot:
    """The values of a fixed list of resource variables as of the last `take()`.

    One C++ snapshot per device the variables live on (an op's resource inputs
    share a device): usually one or two.
    """

    def __init__(self, variables: Sequence[tf.Variable]):
        by_device: dict[str, list[int]] = {}
        for i, variable in enumerate(variables):
            by_device.setdefault(variable.handle.device, []).append(i)
        self._size = len(variables)
        self._groups: list[tuple[int, list[int], list[tf.DType]]] = []
        self._ids: list[int] = []
        if not variables:
            return
        c_api, ops = _library(), load_op_library()
        for device, indices in by_device.items():
            with tf.device(device):
                snapshot_id = int(ops.elastic_variable_snapshot(
                    [variables[i].handle for i in indices]))
            weakref.finalize(self, c_api.TfeVariableSnapshotRelease, snapshot_id)
            self._groups.append((snapshot_id, indices, [variables[i].dtype for i in indices]))
        self._ids = [snapshot_id for snapshot_id, _, _ in self._groups]

    def take(self) -> None:
        """Holds every variable's current value; call it between steps, not during one."""
        for snapshot_id in self._ids:
            _check(_c_api.TfeVariableSnapshotTake(snapshot_id))

    def saved_values(self) -> list[tf.Tensor]:
        """The values held by the last `take()`, in the order of the variables."""
        values: list[tf.Tensor | None] = [None] * self._size
        ops = load_op_library()
        for snapshot_id, indices, dtypes in self._groups:
            for i, value in zip(indices, ops.elastic_variable_snapshot_values(snapshot_id, dtypes)):
                values[i] = value
        return values


class Float64Reader:
    """Reads a small float64 variable in host memory into Python floats, without an eager op."""

    def __init__(self, variable: tf.Variable):
        self._size = int(tf.size(variable))
        self._snapshot = VariableSnapshot([variable])
        self._id = self._snapshot._ids[0]
        self._buffer = (ctypes.c_double * self._size)()

    def __call__(self) -> tuple[float, ...]:
        _check(_c_api.TfeVariableSnapshotReadFloat64(self._id, 0, self._buffer, self._size))
        return tuple(self._buffer)
