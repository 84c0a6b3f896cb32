"""Collectives whose group size and group key are read when a function runs.

Stock MultiWorkerMirroredStrategy bakes the world size and the group key into
every traced function as constants, so a membership change would force every
tf.function (the user's and Keras') to be retraced. CollectiveReduceV2 takes
them as runtime inputs: here they are captured as call-time values, fed from
Python at each call, like TensorFlow already does for instance keys. After a
re-form, the same concrete functions run on the new group.
"""

from __future__ import annotations

from typing import Callable

from tensorflow.python.distribute import cross_device_ops as cross_device_ops_lib
from tensorflow.python.distribute import cross_device_utils, reduce_util
from tensorflow.python.eager import context
from tensorflow.python.framework import dtypes, indexed_slices, ops, tensor_spec
from tensorflow.python.ops import math_ops
from tensorflow.python.util import nest

# Group keys are spaced per generation so that no two generations share one.
KEYS_PER_GENERATION = 16


def collective_keys_for(generation: int) -> cross_device_utils.CollectiveKeys:
    """Fresh keys for a generation: every member derives the same group and instance keys."""
    return cross_device_utils.CollectiveKeys(group_key_start=1 + generation * KEYS_PER_GENERATION)


def call_time_int(key: object, read: Callable[[], int]):
    """`read()` now when running eagerly; inside a function, a placeholder fed with `read()` at each call."""
    if context.executing_eagerly():
        return read()
    graph = ops.get_default_graph()
    while getattr(graph, "is_control_flow_graph", False):
        graph = graph.outer_graph
    if not graph.building_function:
        return read()
    with graph.as_default():
        # A nested function defers again, to the outer function's call time.
        return graph.capture_call_time_value(lambda: call_time_int(key, read),
                                             tensor_spec.TensorSpec([], dtypes.int32), key=key)


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

    When given a `vote` (agreement.ReformVote), every all-reduce also carries
    this member's re-form vote as one extra element.
    """

    def __init__(self, devices, group_size, options, collective_keys, vote=None):
        super().__init__(devices, group_size, options, collective_keys=collective_keys)
        group_key = self._collective_keys.get_group_key(self._devices)
        self._launchers = [ElasticReplicaLauncher(group_key, group_size, self._collective_keys,
                                                  device, options) for device in self._devices]
        self._limited_nccl = any(not launcher.can_order_nccl() for launcher in self._launchers)
        self._vote = vote

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
        size = call_time_int((id(self), "group_size"), lambda: self._group_size)
        return math_ops.cast(size, dtype)

    def _all_reduce(self, reduce_op, value, replica_id, options):
        value = nest.map_structure(_densify, value)
        flat = nest.flatten(value)
        if self._vote is not None and flat and (flat[0].dtype.is_floating
                                                or flat[0].dtype.is_integer):
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
