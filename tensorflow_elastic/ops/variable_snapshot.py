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

from typing import Sequence

import tensorflow as tf

from tensorflow_elastic.ops import load_binding, load_op_library


class SnapshotError(RuntimeError):
    """A snapshot call failed (unknown snapshot, uninitialized variable, wrong dtype)."""


def _create(variables: Sequence[tf.Variable]):
    """A C++ snapshot of `variables` (all on one device), released when it is collected."""
    binding = load_binding()
    # Eagerly, also when a step being traced makes the state hold more variables.
    with tf.init_scope(), tf.device(variables[0].handle.device):
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
        # Why the last take holds a mix of two steps (None: it does not).
        self._torn: str | None = None
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

        Returns the values of `reported` (None without one). Variables on several devices are
        held device by device: when one device's take fails after another's succeeded, the
        snapshot holds a mix of two steps, and `restore()` refuses it until a take succeeds
        on every device.
        """
        reported = None
        for taken, (take, args) in enumerate(self._take_calls):
            try:
                values = take(*args)
            except BaseException as e:
                if taken:
                    self._torn = (f"taking it failed on device {taken + 1} of "
                                  f"{len(self._take_calls)} ({type(e).__name__}: {e}) after the "
                                  f"others had been taken")
                raise
            if values is not None:
                reported = values
        self._torn = None
        return reported

    def restore(self) -> None:
        """Gives `variables` (not `reported`) the values the last `take()` holds, copying nothing:
        each shares the held buffer until its next update copies it. Call it between steps.

        Raises SnapshotError when the last take held some devices' variables and not the
        others': restoring would mix two steps.
        """
        if self._torn is not None:
            raise SnapshotError(f"the last snapshot holds a mix of two steps ({self._torn}): "
                                f"it cannot be restored; this worker must take its state from "
                                f"the other members (start it again: it joins as a new node)")
        for snapshot, indices, _ in self._groups:
            snapshot.restore(indices.index(self._size) if self._size in indices else -1)

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
