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
            c_api.TfeVariableSnapshotTake.argtypes = [
                ctypes.c_int64, ctypes.c_int, ctypes.POINTER(ctypes.c_double), ctypes.c_int64]
            c_api.TfeVariableSnapshotReadFloat64.argtypes = [
                ctypes.c_int64, ctypes.c_int, ctypes.POINTER(ctypes.c_double), ctypes.c_int64]
            c_api.TfeVariableSnapshotRelease.argtypes = [ctypes.c_int64]
            c_api.TfeVariableSnapshotLastError.restype = ctypes.c_char_p
            _c_api = c_api
        return _c_api


def _check(status: int) -> None:
    if status != 0:
        raise SnapshotError(_library().TfeVariableSnapshotLastError().decode())


def _create(owner: object, variables: Sequence[tf.Variable]) -> int:
    """A C++ snapshot of `variables` (all on one device), released when `owner` is collected."""
    c_api = _library()
    with tf.device(variables[0].handle.device):
        snapshot_id = int(load_op_library().elastic_variable_snapshot([v.handle for v in variables]))
    weakref.finalize(owner, c_api.TfeVariableSnapshotRelease, snapshot_id)
    return snapshot_id


class VariableSnapshot:
    """The values of a fixed list of resource variables as of the last `take()`.

    `reported`, a small float64 variable in host memory, is held too, and
    `take()` returns its values: a commit reads the vote's tally in the same
    call. One C++ snapshot per device the variables live on (an op's resource
    inputs share a device): usually one or two.
    """

    def __init__(self, variables: Sequence[tf.Variable], reported: tf.Variable | None = None):
        held = list(variables) + ([] if reported is None else [reported])
        by_device: dict[str, list[int]] = {}
        for i, variable in enumerate(held):
            by_device.setdefault(variable.handle.device, []).append(i)
        self._size = len(variables)
        self._held = len(held)
        self._groups = [(_create(self, [held[i] for i in indices]), indices,
                         [held[i].dtype for i in indices])
                        for indices in by_device.values()]
        self._reported = None
        count = 0
        if reported is not None:
            count = int(tf.size(reported))
            self._reported = (ctypes.c_double * count)()
        # The arguments of each group's C call: (id, index of `reported` in it or -1, out, count).
        self._take_calls = [
            (snapshot_id, indices.index(self._size), self._reported, count)
            if self._size in indices else (snapshot_id, -1, None, 0)
            for snapshot_id, indices, _ in self._groups]

    def take(self) -> tuple[float, ...] | None:
        """Holds every variable's current value; call it between steps, not during one.

        Returns the values of `reported` (None without one).
        """
        for call in self._take_calls:
            _check(_c_api.TfeVariableSnapshotTake(*call))
        return None if self._reported is None else tuple(self._reported)

    def saved_values(self) -> list[tf.Tensor]:
        """The values of `variables` held by the last `take()`, in their order."""
        values: list[tf.Tensor | None] = [None] * self._held
        ops = load_op_library()
        for snapshot_id, indices, dtypes in self._groups:
            for i, value in zip(indices, ops.elastic_variable_snapshot_values(snapshot_id, dtypes)):
                values[i] = value
        return values[:self._size]


class Float64Reader:
    """Reads a small float64 variable in host memory into Python floats, without an eager op."""

    def __init__(self, variable: tf.Variable):
        self._size = int(tf.size(variable))
        self._id = _create(self, [variable])
        self._buffer = (ctypes.c_double * self._size)()

    def __call__(self) -> tuple[float, ...]:
        _check(_c_api.TfeVariableSnapshotReadFloat64(self._id, 0, self._buffer, self._size))
        return tuple(self._buffer)
