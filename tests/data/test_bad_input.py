"""Bad input gets a clear error, early where it can be known."""

import pytest
import tensorflow as tf

from tensorflow_elastic.data import ElasticDataset, elastic_dataset, indexed_records


@pytest.fixture
def state(elastic):
    return dict(world_size=elastic.int64_variable(2), rank=elastic.int64_variable(0))


@pytest.mark.parametrize("global_batch_size, error, message", [
    (0, ValueError, "must be positive"),
    (-4, ValueError, "must be positive"),
    (True, TypeError, "must be an int"),
    (8.0, TypeError, "must be an int"),
])
def test_global_batch_size_must_be_a_positive_int(state, global_batch_size, error, message):
    with pytest.raises(error, match=message):
        elastic_dataset(tf.data.Dataset.range(10), global_batch_size, **state)


def test_an_empty_input_is_refused_at_construction(state):
    with pytest.raises(ValueError, match="empty"):
        elastic_dataset(tf.data.Dataset.range(0), 4, **state)


def test_an_empty_stream_is_reported_at_the_first_batch(state):
    dataset = elastic_dataset(tf.data.Dataset.range(10).filter(lambda x: x < 0), 4, **state)
    with pytest.raises(tf.errors.InvalidArgumentError, match="no global batch: it is empty"):
        next(iter(dataset))


def test_too_short_an_input_with_drop_remainder_is_reported(state):
    dataset = elastic_dataset(tf.data.Dataset.range(3), 4, drop_remainder=True, **state)
    with pytest.raises(tf.errors.InvalidArgumentError, match="fewer than global_batch_size"):
        next(iter(dataset))


def test_state_must_be_scalar_int64_cpu_variables(elastic):
    source = tf.data.Dataset.range(10)
    with pytest.raises(TypeError, match="world_size must be a tf.Variable"):
        ElasticDataset(source, 4, 2, elastic.int64_variable(0))
    with pytest.raises(TypeError, match="rank must be a scalar int64"):
        ElasticDataset(source, 4, elastic.int64_variable(2), tf.Variable(0))
    with pytest.raises(TypeError, match="cursor must be a scalar int64"):
        ElasticDataset(source, 4, elastic.int64_variable(2), elastic.int64_variable(0),
                       tf.Variable([0], dtype=tf.int64))


def test_a_world_larger_than_the_global_batch_is_reported(elastic, state):
    dataset = elastic_dataset(tf.data.Dataset.range(10), 4, **state)
    iterator = iter(dataset)
    state["world_size"].assign(5)
    with pytest.raises(tf.errors.InvalidArgumentError, match="smaller than the number of workers"):
        next(iterator)


def test_a_rank_outside_the_world_is_reported(state):
    dataset = elastic_dataset(tf.data.Dataset.range(10), 4, **state)
    state["rank"].assign(2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"worker_index must be in \[0, 2\)"):
        next(iter(dataset))


def test_the_dataset_cannot_leave_the_process(state):
    dataset = elastic_dataset(tf.data.Dataset.range(10), 4, **state)
    with pytest.raises(tf.errors.FailedPreconditionError, match="cannot be serialized"):
        dataset._as_serialized_graph()


@pytest.mark.parametrize("files, sizes, message", [
    (["a"], [1, 2], "differ in length"),
    ([], [], "files is empty"),
    (["a", "b"], [3, -1], "non-negative"),
])
def test_indexed_records_check_their_arguments(files, sizes, message):
    with pytest.raises(ValueError, match=message):
        indexed_records(files, sizes, lambda name, offset: offset)
