"""Snapshots of variables that a commit takes at every step without an eager op.

A state's commit runs after every training step. Reading its variables with an
eager op (even one `_ReadVariablesOp` for all of them) costs 50-250 us of op
dispatch per commit in TensorFlow 2.21 (measured in running workers: every
eager op runs as a function), several percent of a 10 ms step. Here an op run
once pins the variables in C++; each commit is then one call into a pybind11
binding (`cc/python/`) that takes a reference to every variable's buffer.
Nothing is copied at the commit: the next in-place update copies the buffer
instead (copy-on-write), exactly as when a read of the variable is still alive.
"""

from __future__ import annotations

import importlib.util
import threading
from types import ModuleType
from typing import Sequence

import tensorflow as tf

from tensorflow_elastic.ops import LIBRARY_PATH, OpLibraryError, load_op_library

_lock = threading.Lock()
_binding: ModuleType | None = None


class SnapshotError(RuntimeError):
    """A snapshot call failed (unknown snapshot, uninitialized variable, wrong dtype)."""


def _snapshots() -> ModuleType:
    """The binding, a module built into the op library, so it sees the snapshots the op made."""
    global _binding
    with _lock:
        if _binding is None:
            # TensorFlow loads the library first: it collects the library's ops while loading
            # it. Importing the same file then finds the library already loaded.
            load_op_library()
            spec = importlib.util.spec_from_file_location(f"{__package__}._snapshot", LIBRARY_PATH)
            try:
                binding = importlib.util.module_from_spec(spec)
            except ImportError as e:
                raise OpLibraryError(f"The op library {LIBRARY_PATH} lacks the snapshot binding "
                                     f"({e}); rebuild it with ./install.sh.") from e
            spec.loader.exec_module(binding)
            _binding = binding
        return _binding


def _create(variables: Sequence[tf.Variable]):
    """A C++ snapshot of `variables` (all on one device), released when it is collected."""
    binding = _snapshots()
    with tf.device(variables[0].handle.device):
        snapshot_id = int(load_op_library().elastic_variable_snapshot([v.handle for v in variables]))
    return binding.Snapshot(snapshot_id)


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
        self._groups = [(_create([held[i] for i in indices]), indices,
                         [held[i].dtype for i in indices])
                        for indices in by_device.values()]
        count = 0 if reported is None else int(tf.size(reported))
        # Each group's take and its arguments: (index of `reported` in the group or -1, count).
        self._take_calls = [
            (snapshot.take, (indices.index(self._size), count) if self._size in indices
             else (-1, 0))
            for snapshot, indices, _ in self._groups]

    def take(self) -> tuple[float, ...] | None:
        """Holds every variable's current value; call it between steps, not during one.

        Returns the values of `reported` (None without one).
        """
        reported = None
        for take, args in self._take_calls:
            values = take(*args)
            if values is not None:
                reported = values
        return reported

    def saved_values(self) -> list[tf.Tensor]:
        """The values of `variables` held by the last `take()`, in their order."""
        values: list[tf.Tensor | None] = [None] * self._held
        ops = load_op_library()
        for snapshot, indices, dtypes in self._groups:
            for i, value in zip(indices, ops.elastic_variable_snapshot_values(snapshot.id, dtypes)):
                values[i] = value
        return values[:self._size]


class Float64Reader:
    """Reads a small float64 variable in host memory into Python floats, without an eager op."""

    def __init__(self, variable: tf.Variable):
        self._size = int(tf.size(variable))
        self._snapshot = _create([variable])

    def __call__(self) -> tuple[float, ...]:
        return self._snapshot.read_float64(0, self._size)
