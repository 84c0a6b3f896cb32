"""A per-epoch shuffle that every member agrees on and a restore replays: seeded by the epoch.

A `.shuffle(buffer)` keeps a buffer of examples and draws from it with a
seed of its own: its order cannot be entered at a global batch, differs
between workers without a seed, and is lost with the process. The elastic
input replaces a shuffle that comes right before the input's last `.batch`
with a permutation of the whole pass (tf.data's global shuffle over an
index-addressable input) whose seed is the shuffle's seed combined with the
epoch: the same order on every member, the same order again after a restore
or for a newcomer, a new order each epoch (unless the shuffle said
`reshuffle_each_iteration=False`).
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf
from tensorflow.python.data.experimental.ops import global_shuffle_op
from tensorflow.python.data.ops import shuffle_op
from tensorflow.python.framework import tensor_util

from tensorflow_elastic.tf_internals import private

# Seeds stay below 2**31: tf.data hands them on as int64, mixed with the epoch.
_SEED_RANGE = 2 ** 31
_EPOCH_MIX = 1_000_003
_ShuffleDataset = private(shuffle_op, "_ShuffleDataset")
_global_shuffle = private(global_shuffle_op, "_global_shuffle")


@dataclasses.dataclass(frozen=True)
class Shuffle:
    """What the elastic input keeps of a user's `.shuffle(...)`: its seed, and whether the
    order changes each epoch."""

    seed: int
    reshuffle_each_epoch: bool

    def order(self, examples: tf.data.Dataset, epoch: int) -> tf.data.Dataset:
        """`examples` in this shuffle's order for `epoch`."""
        return epoch_order(examples, self.seed, epoch if self.reshuffle_each_epoch else 0)


def epoch_order(examples: tf.data.Dataset, seed: int, epoch: int) -> tf.data.Dataset:
    """`examples` (a finite, index-addressable dataset) permuted as epoch `epoch` of a shuffle
    seeded by `seed` permutes them: what every member trains on in that epoch.

    Raises ValueError, saying what to change, for an input that cannot be
    permuted (no random access, or no known size).
    """
    try:
        return _global_shuffle(
            examples, seed=(seed * _EPOCH_MIX + epoch) % _SEED_RANGE,
            reshuffle_each_iteration=False)
    except (tf.errors.FailedPreconditionError, tf.errors.InvalidArgumentError) as e:
        raise ValueError(
            f"the input's shuffle cannot be made the same on every worker: the elastic input "
            f"permutes a whole pass by index, which needs a finite input of known size whose "
            f"transformations all support random access (range, from_tensor_slices, map, ...; "
            f"TFRecordDataset over a list of uncompressed files, or a deterministic interleave "
            f"of it; not filter, ignore_errors, from_generator, other files read record by "
            f"record: see tensorflow_elastic.data.indexed_records). TensorFlow says: "
            f"{e.message}") from None


def _seed_of(node: _ShuffleDataset) -> int:
    """One seed from the shuffle's pair (0 for an unseeded shuffle, the same on every member)."""
    values = []
    for tensor in (private(node, "_seed"), private(node, "_seed2")):
        value = tensor_util.constant_value(tensor)
        if value is None:
            raise ValueError("the seed of the input's shuffle() must be a constant")
        values.append(int(value))
    return (values[0] * _EPOCH_MIX + values[1]) % _SEED_RANGE


def _input_chain(dataset: tf.data.Dataset):
    """`dataset` and the datasets it reads, following single inputs."""
    node = dataset
    while node is not None:
        yield node
        node = getattr(node, "_input_dataset", None)


def split_shuffle(examples: tf.data.Dataset) -> tuple[tf.data.Dataset, Shuffle | None]:
    """(the examples without their last shuffle, that shuffle), for the input of the last batch.

    A shuffle elsewhere in the pipeline is refused with a ValueError that says
    to move it right before the batch (per-example maps commute with it).
    """
    if isinstance(examples, _ShuffleDataset):
        reshuffle = private(examples, "_reshuffle_each_iteration")
        shuffle = Shuffle(_seed_of(examples), reshuffle is None or bool(reshuffle))
        examples = private(examples, "_input_dataset")
    else:
        shuffle = None
    if any(isinstance(node, _ShuffleDataset) for node in _input_chain(examples)):
        raise ValueError(
            "the input shuffles before other transformations: the elastic input can only make a "
            "shuffle right before the last .batch(global_batch_size) the same on every worker; "
            "move .shuffle(...) there (after the per-example maps, and drop a .repeat(): each "
            "epoch is one pass)")
    return examples, shuffle
