"""Collectives whose group size and group key are read when a function runs.

Stock MultiWorkerMirroredStrategy bakes the world size and the group key into
every traced function as constants, so a membership change would force every
tf.function (the user's and Keras') to be retraced. CollectiveReduceV2 takes
them as runtime inputs: here a traced function reads them from variables, so
after a re-form (which assigns the new values) the same concrete functions run
on the new group, and a call does no Python work for them (a call-time value
fed from Python at each call costs tens of microseconds of CPU per step).
"""

from __future__ import annotations

import weakref
from typing import Callable

from tensorflow.python.distribute import cross_device_ops as cross_device_ops_lib
from tensorflow.python.distribute import cross_device_utils, reduce_util
from tensorflow.python.eager import context, def_function
from tensorflow.python.framework import constant_op, dtypes, indexed_slices, ops, tensor_shape
from tensorflow.python.framework.tensor import Tensor
from tensorflow.python.ops import array_ops, collective_ops, cond, math_ops, variables
from tensorflow.python.util import nest

from tensorflow_elastic.strategy import ordering
from tensorflow_elastic.tf_internals import require, require_read

# Group keys are spaced per generation so that no two generations share one.
KEYS_PER_GENERATION = 16
# The state broadcast's instance keys, far above those traced functions take (from 100 up).
BROADCAST_INSTANCE_KEY_START = 1 << 30
# The state sync's groups (the source and one receiver each); group keys are 32-bit.
SYNC_GROUP_KEY_START = 1 << 28
SYNC_GROUPS_PER_GENERATION = 1 << 10

# What the classes below override, call or read of TensorFlow's collective launchers (private).
require(cross_device_ops_lib.CollectiveAllReduce, "_all_reduce", "_num_between_graph_workers")
require_read(cross_device_utils.CollectiveReplicaLauncher, "_group_key", "_group_size",
             "_collective_keys")
require(cross_device_utils.CollectiveReplicaLauncher, "_all_gather")
require_read(cross_device_ops_lib.CollectiveAllReduce, "_launchers", "_limited_nccl")
require(cross_device_utils.CollectiveKeys(), "_lock", "_instance_key_table")
require(cross_device_utils, "INSTANCE_KEY_START_NUMBER")


# A generation's groups with a key of their own, whatever devices each member brings (a
# CollectiveKeys hands out keys by each member's own device list): the step's (every replica)
# and the hosts' (one device per member). Above the keys a CollectiveKeys hands out, below the
# commit vote's fallback group (agreement.py).
STEP_GROUP = KEYS_PER_GENERATION - 3
HOST_GROUP = KEYS_PER_GENERATION - 2


class GenerationKeys(cross_device_utils.CollectiveKeys):
    """A generation's collective keys, which also count instance keys for its fixed groups
    (group_key_for), on any device: a CollectiveKeys counts them only for the groups it
    handed out."""

    def get_instance_key(self, group_key, device):
        with self._lock:
            self._instance_key_table.setdefault(group_key, {}).setdefault(
                device, cross_device_utils.INSTANCE_KEY_START_NUMBER)
        return super().get_instance_key(group_key, device)


def collective_keys_for(generation: int) -> GenerationKeys:
    """Fresh keys for a generation: every member derives the same group and instance keys."""
    return GenerationKeys(group_key_start=1 + generation * KEYS_PER_GENERATION)


def group_key_for(generation: int, group: int) -> int:
    """The key of a generation's `group` (STEP_GROUP or HOST_GROUP)."""
    return generation * KEYS_PER_GENERATION + group


def sync_group_key(generation: int, receiver_index: int) -> int:
    """The group key of a generation's state sync from its source to its `receiver_index`-th
    receiver (a range of their own, above every generation's step keys)."""
    if not 0 <= receiver_index < SYNC_GROUPS_PER_GENERATION:
        raise ValueError(f"a state sync has at most {SYNC_GROUPS_PER_GENERATION} receivers, "
                         f"not {receiver_index + 1}")
    key = SYNC_GROUP_KEY_START + generation * SYNC_GROUPS_PER_GENERATION + receiver_index
    if key >= 1 << 31:
        raise ValueError(f"generation {generation} is past the last one whose state sync has "
                         f"a group key (about 1.8 million re-forms): start a new run")
    return key


def building_function() -> bool:
    """Whether ops are being added to a function being traced (rather than run eagerly)."""
    return not context.executing_eagerly() and ops.get_default_graph().building_function


class RuntimeInt:
    """An int that traced functions read from a variable: a Python int eagerly, a tensor in a function."""

    def __init__(self, value: int, name: str):
        self.value = value
        with ops.init_scope(), ops.device("CPU:0"):
            self._variable = variables.Variable(value, dtype=dtypes.int32, trainable=False,
                                                name=name)

    def set(self, value: int) -> None:
        if value != self.value:
            self.value = value
            self._variable.assign(value)

    def read(self) -> int | Tensor:
        if building_function():
            return self._variable.value()
        return self.value


class ElasticReplicaLauncher(cross_device_utils.CollectiveReplicaLauncher):
    """A launcher whose group size and key are runtime values shared by its collective."""

    def __init__(self, group_key: RuntimeInt, group_size: RuntimeInt, collective_keys, device,
                 options):
        self._runtime_group_key = group_key
        self._runtime_group_size = group_size
        super().__init__(group_key.value, group_size.value, collective_keys, device, options)

    @property
    def _group_key(self):
        return self._runtime_group_key.read()

    @_group_key.setter
    def _group_key(self, value: int) -> None:
        self._runtime_group_key.set(value)

    @property
    def _group_size(self):
        return self._runtime_group_size.read()

    @_group_size.setter
    def _group_size(self, value: int) -> None:
        self._runtime_group_size.set(value)

    def use_collective_keys(self, collective_keys: cross_device_utils.CollectiveKeys) -> None:
        """Instance keys from now on come from `collective_keys` (a new generation's)."""
        self._collective_keys = collective_keys

    def all_reduce(self, input_tensor, control_input=None, options=None):
        reduced = super().all_reduce(input_tensor, control_input, options)
        ordering.collective_created(reduced)
        return reduced

    def _all_gather(self, input_tensor, options):
        gathered = super()._all_gather(input_tensor, options)
        ordering.collective_created(gathered)
        return gathered

    def all_gather(self, input_tensor, axis, options=None):
        """Every member's `input_tensor` concatenated along `axis` (lengths along it may differ).

        Pads each part to the longest, gathers, and drops the padding with a
        mask: the stock launcher drops it with a Python loop over the group
        size, which is a runtime value here (Keras' multi-worker `predict`
        gathers its outputs this way).
        """
        if context.executing_eagerly():
            raise RuntimeError("all_gather is not supported in eager mode.")
        with ops.device(self._device), ops.control_dependencies([array_ops.identity(input_tensor)]):
            rank = array_ops.rank(input_tensor)
            # The gathered axis first, and back at the end.
            moved = array_ops.transpose(input_tensor, perm=array_ops.concat(
                ([axis], math_ops.range(axis), math_ops.range(axis + 1, rank)), axis=0))
            lengths = self._all_gather(array_ops.shape_v2(moved)[:1], options)
            longest = math_ops.reduce_max(lengths)
            padding = array_ops.concat(
                ([[0, longest - array_ops.shape_v2(moved)[0]]],
                 array_ops.zeros([rank - 1, 2], dtype=lengths.dtype)), axis=0)
            gathered = self._all_gather(array_ops.pad(moved, padding), options)
            per_member = array_ops.reshape(gathered, array_ops.concat(
                ([-1, longest], array_ops.shape_v2(moved)[1:]), axis=0))
            kept = array_ops.boolean_mask(per_member, array_ops.sequence_mask(lengths, longest))
            return array_ops.transpose(kept, perm=array_ops.concat(
                (math_ops.range(1, axis + 1), [0], math_ops.range(axis + 1, rank)), axis=0))


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

    def __init__(self, devices, group_size, options, collective_keys, group: int,
                 generation: int, vote=None):
        super().__init__(devices, group_size, options, collective_keys=collective_keys)
        require(self, "_collective_keys", "_devices", "_group_size")
        self._group = group
        self._runtime_group_key = RuntimeInt(group_key_for(generation, group),
                                             "elastic_group_key")
        self._runtime_group_size = RuntimeInt(group_size, "elastic_group_size")
        self._launchers = [ElasticReplicaLauncher(self._runtime_group_key, self._runtime_group_size,
                                                  self._collective_keys, device, options)
                           for device in self._devices]
        self._limited_nccl = any(not launcher.can_order_nccl() for launcher in self._launchers)
        self._vote = vote
        self._replicas_voting_in: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @property
    def runtime_group_size(self) -> RuntimeInt:
        """The group size its collectives read when they run."""
        return self._runtime_group_size

    @property
    def runtime_group_key(self) -> RuntimeInt:
        """The group key its collectives read when they run."""
        return self._runtime_group_key

    @property
    def _num_between_graph_workers(self):
        # The world can grow after a function is traced: never take the
        # single-worker shortcut that skips the collective.
        return float("inf")

    def regroup(self, group_size: int, collective_keys: cross_device_utils.CollectiveKeys,
                generation: int) -> None:
        """Moves every launcher to `group_size`, to its group's key in `generation` and to
        that generation's instance keys (`collective_keys`)."""
        self._group_size = group_size
        self._collective_keys = collective_keys
        self._runtime_group_key.set(group_key_for(generation, self._group))
        self._runtime_group_size.set(group_size)
        for launcher in self._launchers:
            launcher.use_collective_keys(collective_keys)

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
            return nest.map_structure(
                lambda v: v / math_ops.cast(self._runtime_group_size.read(), v.dtype), summed)


class VariableBroadcaster:
    """Makes every member's variables equal to one member's: real broadcasts, in one traced call.

    The source runs CollectiveBcastSendV2 on each variable's value, the others
    CollectiveBcastRecvV2 and assign what they receive (a received buffer is
    adopted by the variable, not copied). Variables larger than `chunk_bytes`
    go in chunks, so the transfers of one variable overlap; smaller ones share
    transfers (see transfers()). Group size and key
    are runtime inputs read from variables, so the traced functions (one for
    sending, one for receiving, per list of variables) serve every generation
    and every group: the training step's own at the job's start or in a world
    of two (the instance keys are far from the step's: the broadcast, the first
    collective of a new generation, resolves the group, and the first step
    after it does not wait for that again), or otherwise pairs of the source and
    each member that needs the state (a growth: each newcomer).
    """

    def __init__(self, device: str, chunk_bytes: int = 4 << 20):
        self._device = device
        self._group_size = RuntimeInt(1, "elastic_sync_group_size")
        self._group_key = RuntimeInt(0, "elastic_sync_group_key")
        self._chunk_bytes = chunk_bytes
        self._functions: dict[tuple[tuple[int, ...], bool], tuple[list, Callable]] = {}

    def chunks(self, variable) -> list[tuple[int, int]]:
        """The [start, end) element ranges `variable` travels in (none for an empty one)."""
        size = tensor_shape.TensorShape(variable.shape).num_elements()
        step = max(1, self._chunk_bytes // dtypes.as_dtype(variable.dtype).size)
        return [(start, min(size, start + step)) for start in range(0, size, step)]

    def broadcast(self, variables: list, is_source: bool, group_size: int,
                  group_key: int) -> None:
        """Every member of the group calls it with the same variables (same order); one is the
        source."""
        self._group_size.set(group_size)
        self._group_key.set(group_key)
        self._function(variables, is_source)(constant_op.constant(True))

    def broadcast_in_pairs(self, variables: list, node_id: int, source: int,
                           receivers: list[int], generation: int) -> None:
        """The source sends to each receiver in turn, in a group of the two (see
        sync_group_key()); the source and the receivers call it.

        A receiver whose transfer fails (its state differs, it dies) fails alone:
        in one group of all receivers, a shape mismatch fails every receiver
        alike, and a healthy newcomer could not tell that it is not the one to
        blame. The receivers after a failed one wait until the generation's
        collectives are aborted.
        """
        for index, receiver in enumerate(sorted(receivers)):
            if node_id in (source, receiver):
                self.broadcast(variables, node_id == source, 2,
                               sync_group_key(generation, index))

    def prepare(self, variables: list, is_source: bool) -> None:
        """Traces and instantiates the function that broadcast() runs, transferring nothing
        (once): a newcomer does it before joining, so the members wait neither for its tracing
        (seconds for hundreds of variables) nor for TensorFlow's optimization of the traced
        graph."""
        if self._key(variables, is_source) not in self._functions:
            self._function(variables, is_source)(constant_op.constant(False))

    @staticmethod
    def _key(variables: list, is_source: bool) -> tuple[tuple[int, ...], bool]:
        return tuple(id(v) for v in variables), is_source

    def _function(self, variables: list, is_source: bool):
        key = self._key(variables, is_source)
        if key not in self._functions:
            # The variables are kept with the function, so their ids are not reused meanwhile.
            self._functions[key] = (list(variables), self._trace(list(variables), is_source))
        return self._functions[key][1]

    def transfers(self, variables: list) -> list[list[tuple[int, int, int]]]:
        """The collectives a broadcast of `variables` runs, in order: each a list of (variable
        index, start, end) element ranges laid end to end. A variable of at least `chunk_bytes`
        travels in chunks of its own (see chunks()); smaller ones of one dtype share transfers
        of up to `chunk_bytes`, so a model of many small variables costs a few collectives
        (each resolved with the group's leader before it moves a byte), not one per variable."""
        planned: list[list[tuple[int, int, int]]] = []
        # Per dtype: the transfer that small variables still join, and its bytes so far.
        filling: dict[dtypes.DType, tuple[list[tuple[int, int, int]], int]] = {}
        for index, variable in enumerate(variables):
            dtype = dtypes.as_dtype(variable.dtype)
            size = tensor_shape.TensorShape(variable.shape).num_elements()
            if size * dtype.size >= self._chunk_bytes:
                planned += [[(index, start, end)] for start, end in self.chunks(variable)]
                continue
            if size == 0:
                continue
            transfer, used = filling.get(dtype, (None, 0))
            if transfer is None or used + size * dtype.size > self._chunk_bytes:
                transfer, used = [], 0
                planned.append(transfer)
            transfer.append((index, 0, size))
            filling[dtype] = (transfer, used + size * dtype.size)
        return planned

    def _trace(self, variables: list, is_source: bool) -> Callable:
        def transfer():
            group_size = self._group_size.read()
            group_key = self._group_key.read()
            shapes = [tensor_shape.TensorShape(v.shape) for v in variables]
            sent = []
            received: dict[int, list] = {}
            flat = {}
            for number, ranges in enumerate(self.transfers(variables)):
                instance_key = BROADCAST_INSTANCE_KEY_START + 1 + number
                dtype = dtypes.as_dtype(variables[ranges[0][0]].dtype)
                with ops.device(self._device):
                    if is_source:
                        parts = []
                        for index, start, end in ranges:
                            if index not in flat:
                                flat[index] = array_ops.reshape(variables[index], [-1])
                            whole = end - start == shapes[index].num_elements()
                            parts.append(flat[index] if whole else flat[index][start:end])
                        payload = parts[0] if len(parts) == 1 else array_ops.concat(parts, 0)
                        sent.append(collective_ops.broadcast_send_v2(
                            payload, group_size, group_key, instance_key))
                        continue
                    value = collective_ops.broadcast_recv_v2(
                        [sum(end - start for _, start, end in ranges)], dtype, group_size,
                        group_key, instance_key)
                    offset = 0
                    for index, start, end in ranges:
                        received.setdefault(index, []).append(
                            value if len(ranges) == 1 else value[offset:offset + end - start])
                        offset += end - start
            for index, parts in received.items():
                value = parts[0] if len(parts) == 1 else array_ops.concat(parts, axis=0)
                variables[index].assign(array_ops.reshape(value, shapes[index]))
            # A send whose output nothing uses would be pruned from the function.
            with ops.control_dependencies(sent):
                return array_ops.identity(group_size)

        # One graph for both: TensorFlow lowers the condition into the function's graph, so a
        # call that transfers nothing instantiates everything a transfer runs.
        @def_function.function(autograph=False)
        def run(active):
            # The sync writes every variable outside any step: not a step's unordered write.
            ordering.exempt_current_graph()
            return cond.cond(active, transfer, lambda: self._group_size.read())

        return run
