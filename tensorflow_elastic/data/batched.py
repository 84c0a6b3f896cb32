"""A batched `tf.data.Dataset` (what Keras `fit` gets) cut into the same global batches elastically.

Users hand `fit` the pipeline they already have, ending in `.batch(G)`. The
strategy's `experimental_distribute_dataset` takes the examples before that
batch and cuts global batches of G through the elastic input op, so every
worker gets its slice of the same global batches whatever the world size.
Where a pass starts is the input's *position* (in global batches), set by
whoever knows how far training got (the elastic Keras callback): every new
iterator starts there, so a `fit` called again after a re-form continues the
interrupted pass instead of starting it over. A `.shuffle` right before that
batch becomes a permutation of the pass seeded by the epoch (data/shuffle.py),
which the position also names: (epoch, global batch). A pipeline that reads
TFRecord files is read by record index (data/addressable.py).
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf
from tensorflow.python.data.ops import batch_op, dataset_ops, prefetch_op
from tensorflow.python.framework import tensor_util

from tensorflow_elastic.data.addressable import addressable
from tensorflow_elastic.data.elastic_dataset import ElasticDataset
from tensorflow_elastic.data.shuffle import Shuffle, split_shuffle
from tensorflow_elastic.tf_internals import private

# Transformations after the batch that only buffer or set options: dropped, they
# would read ahead of the training step (the elastic input must be the last one).
_PASS_THROUGH = (private(prefetch_op, "_PrefetchDataset"), private(dataset_ops, "_OptionsDataset"))
_BATCHES = (private(batch_op, "_BatchDataset"), private(batch_op, "_ParallelBatchDataset"))


def _constant(tensor, what: str):
    value = tensor_util.constant_value(tensor)
    if value is None:
        raise ValueError(f"the {what} of the input's last batch() must be a constant")
    return value.item()


def split_batches(dataset: tf.data.Dataset) -> tuple[tf.data.Dataset, int, bool]:
    """(examples, global batch size, drop_remainder) of a dataset that ends with `.batch(G)`.

    Raises ValueError, saying what to change, for a pipeline whose last
    transformation (prefetch and options aside) is not a plain `batch`.
    """
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"the elastic strategy distributes tf.data.Dataset inputs, got "
                        f"{type(dataset).__name__}: wrap the data in tf.data.Dataset."
                        f"from_tensor_slices(...).batch(global_batch_size)")
    node = dataset
    while isinstance(node, _PASS_THROUGH):
        node = private(node, "_input_dataset")
    if not isinstance(node, _BATCHES):
        raise ValueError(
            f"the elastic strategy cuts the global batches of the input itself, so the input "
            f"must end with .batch(global_batch_size) (a prefetch after it is fine), but it ends "
            f"with {type(node).__name__.lstrip('_')}: move that transformation before the batch "
            f"(for NumPy arrays, which Keras turns into such a pipeline, pass "
            f"tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch_size)), or call "
            f"strategy.distribute_elastic_dataset(examples, global_batch_size) in a custom loop")
    return (private(node, "_input_dataset"),
            int(_constant(private(node, "_batch_size"), "batch size")),
            bool(_constant(private(node, "_drop_remainder"), "drop_remainder")))


def _batches_per_pass(examples: tf.data.Dataset, global_batch_size: int,
                      drop_remainder: bool) -> int | None:
    count = int(examples.cardinality()) if tf.executing_eagerly() else -1
    if count < 0:
        return None
    return count // global_batch_size if drop_remainder else -(-count // global_batch_size)


def _examples_read(dataset: tf.data.Dataset) -> tuple[tf.data.Dataset, int, bool, Shuffle | None]:
    """(the examples as the elastic input reads them, global batch size, drop_remainder, the
    shuffle) of the batched `dataset`."""
    examples, global_batch_size, drop_remainder = split_batches(dataset)
    examples, shuffle = split_shuffle(examples)
    return (addressable(examples, shuffled=shuffle is not None), global_batch_size,
            drop_remainder, shuffle)


def global_batches_per_pass(dataset: tf.data.Dataset) -> int | None:
    """Global batches in one pass of the batched `dataset` as the elastic input reads it (known
    for TFRecord files, which stock tf.data cannot count); None if endless or unknown.

    Raises ValueError, as `distribute_batched` would, for a pipeline it cannot take.
    """
    examples, global_batch_size, drop_remainder, _ = _examples_read(dataset)
    return _batches_per_pass(examples, global_batch_size, drop_remainder)


class PositionedElasticDataset(ElasticDataset):
    """An elastic dataset each of whose new iterators starts at `position` (in global batches).

    For a finite input of known size a position counts from the start of a
    pass; otherwise from the start of the (endless or unknown) stream. With a
    `shuffle`, a new iterator reads the examples in the order of the epoch
    last given to `seek`.
    """

    def __init__(self, dataset: tf.data.Dataset, global_batch_size: int,
                 world_size: tf.Variable, rank: tf.Variable, drop_remainder: bool,
                 shuffle: Shuffle | None = None, replica_devices: Sequence[str] = ()):
        self._examples = dataset
        self._shuffle = shuffle
        super().__init__(dataset if shuffle is None else shuffle.order(dataset, 0),
                         global_batch_size, world_size, rank, drop_remainder=drop_remainder,
                         replica_devices=replica_devices)
        self.position = 0
        self.epoch = 0
        # (epoch, the elastic dataset over that epoch's order), sharing this cursor.
        self._epoch_input: tuple[int, ElasticDataset] | None = None
        # Global batches in a pass; None for an endless input or one of unknown size.
        self.batches_per_pass = _batches_per_pass(dataset, global_batch_size, drop_remainder)

    def seek(self, position: int, epoch: int = 0) -> None:
        """Starts the next global batch (of this and every later iterator) at `position`; a new
        iterator of a shuffled input reads `epoch`'s order."""
        if position < 0 or epoch < 0:
            raise ValueError(f"position and epoch must be >= 0, got {position} and {epoch}")
        self.position = position
        self.epoch = epoch
        self.cursor.assign(position)

    def __iter__(self):
        self.cursor.assign(self.position)
        # Epoch 0's order (or the one order of a shuffle that does not reshuffle) is this
        # dataset's own.
        if self._shuffle is None or not self._shuffle.reshuffle_each_epoch or self.epoch == 0:
            return super().__iter__()
        if self._epoch_input is None or self._epoch_input[0] != self.epoch:
            self._epoch_input = (self.epoch, ElasticDataset(
                self._shuffle.order(self._examples, self.epoch), self.global_batch_size,
                self.world_size, self.rank, self.cursor, self.drop_remainder,
                self.replica_devices))
        return iter(self._epoch_input[1])


def distribute_batched(dataset: tf.data.Dataset, world_size: tf.Variable, rank: tf.Variable,
                       replica_devices: Sequence[str] = ()) -> PositionedElasticDataset:
    """This worker's slices of the global batches of the batched `dataset`; see `split_batches`."""
    examples, global_batch_size, drop_remainder, shuffle = _examples_read(dataset)
    return PositionedElasticDataset(examples, global_batch_size, world_size, rank, drop_remainder,
                                    shuffle, replica_devices)
