"""The batched input Keras hands the strategy: its global batches, cut elastically from a position."""

import pytest
import tensorflow as tf

from tensorflow_elastic.data.batched import PositionedElasticDataset, distribute_batched, split_batches
from tensorflow_elastic.data.shuffle import epoch_order


def test_the_last_batch_is_the_global_batch_and_a_prefetch_after_it_is_dropped():
    examples, global_batch, drop = split_batches(
        tf.data.Dataset.range(10).map(lambda x: x * 2).batch(4, drop_remainder=True).prefetch(2))
    assert (global_batch, drop) == (4, True)
    assert list(examples.as_numpy_iterator()) == [x * 2 for x in range(10)]


def test_an_input_that_does_not_end_with_a_batch_says_what_to_change():
    with pytest.raises(ValueError, match=r"must end with \.batch\(global_batch_size\).*MapDataset"):
        split_batches(tf.data.Dataset.range(10).batch(4).map(lambda x: x))
    with pytest.raises(TypeError, match="tf.data.Dataset"):
        split_batches([1, 2, 3])


def test_batches_per_pass_follow_the_size_and_drop_remainder(elastic):
    world, rank = elastic.int64_variable(2), elastic.int64_variable(0)
    assert distribute_batched(tf.data.Dataset.range(10).batch(4), world, rank).batches_per_pass == 3
    assert distribute_batched(tf.data.Dataset.range(10).batch(4, drop_remainder=True), world,
                              rank).batches_per_pass == 2
    assert distribute_batched(tf.data.Dataset.range(10).repeat().batch(4), world,
                              rank).batches_per_pass is None


def test_every_new_iterator_starts_at_the_position(elastic):
    world, rank = elastic.int64_variable(2), elastic.int64_variable(1)
    dataset = distribute_batched(tf.data.Dataset.range(40).batch(8), world, rank)
    assert isinstance(dataset, PositionedElasticDataset)
    assert next(iter(dataset)).numpy().tolist() == [4, 5, 6, 7]
    dataset.seek(3)
    first = iter(dataset)
    assert next(first).numpy().tolist() == [28, 29, 30, 31]
    assert next(iter(dataset)).numpy().tolist() == [28, 29, 30, 31]  # a new iterator: again
    assert next(first).numpy().tolist() == [36, 37, 38, 39]
    with pytest.raises(ValueError, match=">= 0"):
        dataset.seek(-1)


def _pass(dataset) -> list[int]:
    return [x for batch in dataset for x in batch.numpy().tolist()]


def test_a_shuffle_before_the_batch_is_a_per_epoch_permutation_equal_on_every_worker(elastic):
    shuffled = tf.data.Dataset.range(40).shuffle(40, seed=7).batch(8)
    worlds = [distribute_batched(shuffled, elastic.int64_variable(2), elastic.int64_variable(rank))
              for rank in (0, 1)]
    orders = {}
    for epoch in (0, 1, 2, 1):
        parts = []
        for dataset in worlds:
            dataset.seek(0, epoch)
            parts.append(list(iter(dataset)))
        # Each global batch of 8 is cut 4 + 4 between the two ranks.
        order = [x for a, b in zip(*parts) for x in a.numpy().tolist() + b.numpy().tolist()]
        assert sorted(order) == list(range(40))
        assert orders.setdefault(epoch, order) == order, "an epoch's order must replay"
        assert order == _pass(epoch_order(tf.data.Dataset.range(40), worlds[0]._shuffle.seed,
                                          epoch).batch(8))
    assert orders[0] != list(range(40)) and orders[0] != orders[1] != orders[2]
    # Entering at a global batch (a restore, a newcomer) reads the rest of the same order.
    worlds[0].world_size.assign(1)
    worlds[0].seek(3, 1)
    assert _pass(worlds[0]) == orders[1][24:]


def test_a_shuffle_that_does_not_reshuffle_keeps_one_order_and_an_unseeded_one_agrees():
    world, rank = (tf.Variable(1, dtype=tf.int64) for _ in range(2))
    rank.assign(0)
    fixed = distribute_batched(
        tf.data.Dataset.range(12).shuffle(4, seed=3, reshuffle_each_iteration=False).batch(4),
        world, rank)
    first = _pass(fixed)
    fixed.seek(0, 5)
    assert _pass(fixed) == first != list(range(12))
    unseeded = [_pass(distribute_batched(tf.data.Dataset.range(12).shuffle(12).batch(4),
                                         world, rank)) for _ in range(2)]
    assert unseeded[0] == unseeded[1]


def test_a_shuffle_that_cannot_be_made_exact_says_what_to_change(elastic):
    world, rank = elastic.int64_variable(1), elastic.int64_variable(0)
    with pytest.raises(ValueError, match="move .shuffle"):
        distribute_batched(tf.data.Dataset.range(12).shuffle(4).map(lambda x: x).batch(4),
                           world, rank)
    with pytest.raises(ValueError, match="random access.*indexed_records"):
        distribute_batched(tf.data.Dataset.range(12).filter(lambda x: x > 2).shuffle(4).batch(4),
                           world, rank)
