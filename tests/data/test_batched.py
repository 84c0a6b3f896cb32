"""The batched input Keras hands the strategy: its global batches, cut elastically from a position."""

import pytest
import tensorflow as tf

from tensorflow_elastic.data.batched import PositionedElasticDataset, distribute_batched, split_batches


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
