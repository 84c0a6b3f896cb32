"""The elastic dataset: this worker's part of every global batch, following the membership.

The strategy owns int64 variables for the world size and this worker's rank;
the dataset reads them, and the global cursor, at every element, so a
membership change takes effect at the next global batch without rebuilding the
pipeline. The C++ op advances the cursor as it hands out a batch, so the cursor
is exactly the number of global batches the training step has taken, provided
nothing buffers elements after this dataset: that is why the dataset turns off
tf.data's injected prefetch and must stay the last transformation.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf
from tensorflow.python.data.ops import dataset_ops
from tensorflow.python.ops import resource_variable_ops

from tensorflow_elastic.data.addressable import addressable
from tensorflow_elastic.data.replicas import ReplicaIterator, replica_spec
from tensorflow_elastic.ops import load_op_library
from tensorflow_elastic.tf_internals import private

CURSOR_VARIABLE_NAME = "elastic_input_cursor"


def _check_state_variable(name: str, variable: tf.Variable) -> None:
    """The op reads raw resource handles: anything else would fail late and obscurely."""
    if not isinstance(variable, tf.Variable) or not hasattr(variable, "handle"):
        raise TypeError(f"{name} must be a tf.Variable (the strategy's state), got "
                        f"{type(variable).__name__}")
    if variable.dtype != tf.int64 or variable.shape.rank != 0:
        raise TypeError(f"{name} must be a scalar int64 variable, got {variable.dtype.name} "
                        f"with shape {variable.shape}")
    if "CPU" not in variable.device.upper():
        raise ValueError(f"{name} must live on the CPU (the input pipeline reads it there), "
                         f"got device {variable.device!r}")


def _check_global_batch_size(global_batch_size: int) -> int:
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int):
        raise TypeError(f"global_batch_size must be an int, got {global_batch_size!r}")
    if global_batch_size <= 0:
        raise ValueError(f"global_batch_size must be positive, got {global_batch_size}")
    return global_batch_size


def _check_not_empty(dataset: tf.data.Dataset) -> None:
    # Known only in eager mode and for sources with a static size; the op
    # raises the same error at the first element otherwise.
    if tf.executing_eagerly() and int(dataset.cardinality()) == 0:
        raise ValueError("The input of the elastic dataset is empty")


def new_cursor_variable() -> tf.Variable:
    """A fresh cursor at global batch 0, on the CPU, outside any function or strategy scope.

    Built as a plain ResourceVariable: a strategy's scope (Keras distributes its
    inputs inside it) would otherwise make it a mirrored variable.
    """
    with tf.init_scope(), tf.device("/cpu:0"):
        return resource_variable_ops.ResourceVariable(0, dtype=tf.int64, trainable=False,
                                                      name=CURSOR_VARIABLE_NAME)


class _ElasticBatchDataset(dataset_ops.UnaryDataset):
    """The raw ElasticBatchDataset op: batches of unknown leading size."""

    def __init__(self, dataset: tf.data.Dataset, global_batch_size: int, world_size: tf.Variable,
                 rank: tf.Variable, cursor: tf.Variable, drop_remainder: bool,
                 local_replicas: int):
        self._element_spec = tf.nest.map_structure(lambda spec: private(spec, "_batch")(None),
                                                   dataset.element_spec)
        variant = load_op_library().elastic_batch_dataset(
            private(dataset, "_variant_tensor"), tf.constant(global_batch_size, tf.int64), world_size.handle,
            rank.handle, cursor.handle, drop_remainder=drop_remainder,
            local_replicas=local_replicas, **self._flat_structure)
        super().__init__(dataset, variant)

    @property
    def element_spec(self):
        return self._element_spec


def _no_buffering_options() -> tf.data.Options:
    options = tf.data.Options()
    # A prefetch after the op would read the cursor and membership ahead of
    # the training step; tf.data injects one under autotune unless told not to.
    options.experimental_optimization.inject_prefetch = False
    # Sharding is this dataset's job; a strategy must not shard it again.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return options


class ElasticDataset(dataset_ops.UnaryUnchangedStructureDataset):
    """This worker's slices of consecutive global batches of `dataset`.

    Each element is this worker's part of one global batch (the first
    `global_batch_size % world_size` ranks take one element more), so the
    global batch stays `global_batch_size` whatever the world size. The last
    partial global batch of a finite input keeps each worker's slice clipped to
    the elements that exist (some workers then get an empty batch), or ends the
    pass with `drop_remainder=True`. At the end of a pass the cursor goes back
    to 0, so the next `iter()` starts the next pass; a new iterator otherwise
    starts at the cursor (that is how a newcomer or a restored worker resumes).

    Apply no transformation after it (least of all `prefetch`): elements
    buffered after it would be cut for a membership that may have changed.

    A worker that drives several devices (`replica_devices`, k of them) takes
    the slices of k consecutive replicas: `world_size` then counts the job's
    replicas and `rank` is this worker's first one. Its iterators cut every
    batch among the devices (data/replicas.py) and hand out PerReplica values.
    """

    def __init__(self, dataset: tf.data.Dataset, global_batch_size: int,
                 world_size: tf.Variable, rank: tf.Variable, cursor: tf.Variable | None = None,
                 drop_remainder: bool = False, replica_devices: Sequence[str] = ()):
        if not isinstance(dataset, tf.data.Dataset):
            raise TypeError(f"dataset must be a tf.data.Dataset, got {type(dataset).__name__}")
        self._global_batch_size = _check_global_batch_size(global_batch_size)
        _check_not_empty(dataset)
        cursor = new_cursor_variable() if cursor is None else cursor
        for name, variable in (("world_size", world_size), ("rank", rank), ("cursor", cursor)):
            _check_state_variable(name, variable)
        self._world_size, self._rank, self._cursor = world_size, rank, cursor
        self._drop_remainder = bool(drop_remainder)
        self._replica_devices = tuple(replica_devices)
        batched = _ElasticBatchDataset(dataset, global_batch_size, world_size, rank, cursor,
                                       self._drop_remainder, max(1, len(self._replica_devices))
                                       ).with_options(_no_buffering_options())
        super().__init__(batched, private(batched, "_variant_tensor"))

    def __iter__(self):
        iterator = super().__iter__()
        if len(self._replica_devices) > 1:
            return ReplicaIterator(iterator, self._replica_devices)
        return iterator

    @property
    def replica_element_spec(self):
        """The spec of what its iterators hand out: `element_spec` with one local device, one
        `PerReplicaSpec` per leaf with several. A step traced for it (`input_signature`, or
        `get_concrete_function` before a newcomer joins) serves every world size and split."""
        return replica_spec(self.element_spec, max(1, len(self._replica_devices)))

    @property
    def cursor(self) -> tf.Variable:
        """The next global batch of the current pass: commit it, assign it back to roll back."""
        return self._cursor

    @property
    def world_size(self) -> tf.Variable:
        return self._world_size

    @property
    def rank(self) -> tf.Variable:
        return self._rank

    @property
    def global_batch_size(self) -> int:
        return self._global_batch_size

    @property
    def drop_remainder(self) -> bool:
        return self._drop_remainder

    @property
    def replica_devices(self) -> tuple[str, ...]:
        """The devices its batches are cut among (none: one replica, plain batches)."""
        return self._replica_devices


def elastic_dataset(dataset: tf.data.Dataset, global_batch_size: int, world_size: tf.Variable,
                    rank: tf.Variable, cursor: tf.Variable | None = None,
                    drop_remainder: bool = False,
                    replica_devices: Sequence[str] = ()) -> ElasticDataset:
    """This worker's slices of the global batches of `dataset`; see :class:`ElasticDataset`.

    `world_size` and `rank` are the strategy's scalar int64 CPU variables
    (rank in 0..world_size-1), `cursor` the input's position in global batches
    (a new one at 0 if omitted). All three are read at every element. A `dataset` that reads
    TFRecord files is read by record index (see data/addressable.py).
    """
    if isinstance(dataset, tf.data.Dataset):
        dataset = addressable(dataset, shuffled=False)
    return ElasticDataset(dataset, global_batch_size, world_size, rank, cursor, drop_remainder,
                          replica_devices)
