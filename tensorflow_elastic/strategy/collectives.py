"""Collectives whose group size and group key are read when a function runs.

Stock MultiWorkerMirroredStrategy bakes the world size and the group key into
every traced function as constants, so a membership change would force every
tf.function (the user's and Keras') to be retraced. CollectiveReduceV2 takes
them as runtime inputs: here they are captured as call-time values, fed from
Python at each call, like TensorFlow already does for instance keys. After a
re-form, the same concrete functions run on the new group.
"""

from __future__ import annotations

import functools
import weakref
from typing import Callable

from tensorflow.python.distribute import cross_device_ops as cross_device_ops_lib
from tensorflow.python.distribute import cross_device_utils, reduce_util
from tensorflow.python.eager import context
from tensorflow.python.framework import constant_op, dtypes, indexed_slices, ops, tensor_spec
from tensorflow.python.framework.tensor import Tensor
from tensorflow.python.util import nest

# Group keys are spaced per generation so that no two generations share one.
KEYS_PER_GENERATION = 16


def collective_keys_for(generation: int) -> cross_device_utils.CollectiveKeys:
    """Fresh keys for a generation: every member derives the same group and instance keys."""
    return cross_device_utils.CollectiveKeys(group_key_start=1 + generation * KEYS_PER_GENERATION)


def _function_graph() -> ops.Graph | None:
    """The function being traced (the outermost one around control flow), or None."""
    if context.executing_eagerly():
        return None
    graph = ops.get_default_graph()
    while getattr(graph, "is_control_flow_graph", False):
        graph = graph.outer_graph
    return graph if graph.building_function else None


def call_time_value(key: object, read: Callable[[], object], dtype: dtypes.DType,
                    shape: tuple[int, ...] = ()) -> Tensor:
    """A `dtype` tensor holding `read()`: now, or inside a function a placeholder fed at each call.

    The placeholder is fed a cached host tensor, so a call converts nothing.
    """
    graph = _function_graph()
    if graph is None:
        return _host_constant(read(), dtype)
    with graph.as_default():
        # A nested function's capture is captured again by the outer function,
        # so the closure always runs eagerly, at the outermost call.
        return graph.capture_call_time_value(lambda: _host_constant(read(), dtype),
                                             tensor_spec.TensorSpec(shape, dtype), key=key)


def call_time_int(key: object, read: Callable[[], int]) -> int | Tensor:
    """`read()` as a Python int now, or inside a function a placeholder fed with it at each call.

    Eagerly it stays a Python int: the stock launchers key their instance keys by it.
    """
    if _function_graph() is None:
        return read()
    return call_time_value(key, read, dtypes.int32)


@functools.lru_cache(maxsize=256)
def _host_constant(value: object, dtype: dtypes.DType) -> Tensor:
    """Group sizes, group keys and ballots take few values: each becomes a tensor once."""
    with ops.device("CPU:0"):
        return constant_op.constant(value, dtype)


class ElasticReplicaLauncher(cross_device_utils.CollectiveReplicaLauncher):
    """A launcher whose group size and key are call-time values."""

    def __init__(self, group_key, group_size, collective_keys, device, options):
        self._current_group_key = group_key
        self._current_group_size = group_size
        super().__init__(group_key, group_size, collective_keys, device, options)

    @property
    def _group_key(self):
        return call_time_int((id(self), "group_key"), lambda: self._current_group_key)

    @_group_key.setter
    def _group_key(self, value: int) -> None:
        self._current_group_key = value

    @property
    def _group_size(self):
        return call_time_int((id(self), "group_size"), lambda: self._current_group_size)

    @_group_size.setter
    def _group_size(self, value: int) -> None:
        self._current_group_size = value

    def regroup(self, group_key: int, group_size: int,
                collective_keys: cross_device_utils.CollectiveKeys) -> None:
        self._current_group_key = group_key
        self._current_group_size = group_size
        self._collective_keys = collective_keys


def _densify(value):
    """Sparse gradients are reduced dense: their all-gather path needs the world size at trace time."""
    if isinstance(value, indexed_slices.IndexedSlices):
        return ops.convert_to_tensor(value)
    return value


class ElasticCollectiveAllReduce(cross_device_ops_lib.CollectiveAllReduce):
    """CollectiveAllReduce on elastic launchers; MEAN divides by the runtime group size.

    When given a `vote` (agreement.ReformVote), the first all-reduce of every
    traced function (and every eager one) also carries this member's re-form
    vote: two extra elements.
    """

    def __init__(self, devices, group_size, options, collective_keys, vote=None):
        super().__init__(devices, group_size, options, collective_keys=collective_keys)
        group_key = self._collective_keys.get_group_key(self._devices)
        self._launchers = [ElasticReplicaLauncher(group_key, group_size, self._collective_keys,
                                                  device, options) for device in self._devices]
        self._limited_nccl = any(not launcher.can_order_nccl() for launcher in self._launchers)
        self._vote = vote
        self._replicas_voting_in: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @property
    def _num_between_graph_workers(self):
        # The world can grow after a function is traced: never take the
        # single-worker shortcut that skips the collective.
        return float("inf")

    def regroup(self, group_size: int, collective_keys: cross_device_utils.CollectiveKeys) -> None:
        """Moves every launcher to `group_size` and to its group key in `collective_keys`."""
        group_key = collective_keys.get_group_key(self._devices)
        self._group_size = group_size
        self._collective_keys = collective_keys
        for launcher in self._launchers:
            launcher.regroup(group_key, group_size, collective_keys)

    def _runtime_group_size(self, dtype):
        return call_time_value((id(self), "group_size", dtype), lambda: self._group_size, dtype)

    def _carries_vote(self, flat: list, replica_id: int) -> bool:
        """Whether this all-reduce carries the vote: one per replica and traced function is enough.

        Every eager all-reduce carries it.
        """
        if self._vote is None or not flat or not (flat[0].dtype.is_floating
                                                  or flat[0].dtype.is_integer):
            return False
        graph = ops.get_default_graph()
        if not graph.building_function:
            return True
        carried = self._replicas_voting_in.setdefault(graph, set())
        if replica_id in carried:
            return False
        carried.add(replica_id)
        return True

    def _all_reduce(self, reduce_op, value, replica_id, options):
        value = nest.map_structure(_densify, value)
        flat = nest.flatten(value)
        if self._carries_vote(flat, replica_id):
            # Every replica carries a ballot, so all pack the same number of elements.
            with ops.device(self._devices[replica_id]):
                ballot = self._vote.ballot(flat[0].dtype)
            summed = super()._all_reduce(reduce_util.ReduceOp.SUM, flat + [ballot], replica_id,
                                         options)
            if replica_id == 0:
                self._vote.record(summed[-1])
            summed = nest.pack_sequence_as(value, summed[:-1])
        else:
            summed = super()._all_reduce(reduce_util.ReduceOp.SUM, value, replica_id, options)
        if reduce_op != reduce_util.ReduceOp.MEAN:
            return summed
        with ops.device(self._devices[replica_id]):
            return nest.map_structure(lambda v: v / self._runtime_group_size(v.dtype), summed)
