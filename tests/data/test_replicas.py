"""A worker that drives several replicas: its slice is theirs, cut again per replica."""

import pytest
import tensorflow as tf

from tensorflow_elastic.data import elastic_dataset
from tensorflow_elastic.data.replicas import distribute_batch, split_sizes


@pytest.mark.parametrize("size, parts, sizes", [
    (6, 2, [3, 3]), (7, 2, [4, 3]), (5, 3, [2, 2, 1]), (1, 2, [1, 0]), (0, 2, [0, 0])])
def test_a_batch_is_cut_with_the_extra_elements_first(size, parts, sizes):
    assert split_sizes(size, parts) == sizes
    assert split_sizes(tf.constant(size, tf.int64), parts).numpy().tolist() == sizes


def _replica_slices(global_batch, replicas):
    """The job's rule: the first global_batch % replicas replicas take one element more."""
    sizes = split_sizes(global_batch, replicas)
    starts = [sum(sizes[:r]) for r in range(replicas)]
    return [list(range(start, start + size)) for start, size in zip(starts, sizes)]


@pytest.mark.parametrize("counts", [[2, 2], [1, 2], [2, 1, 2], [3, 1]])
def test_every_replica_of_every_worker_gets_its_slice_of_the_global_batch(elastic, counts):
    """Workers with different numbers of replicas: one batch each, cut among their devices;
    together the replica slices are the job's rule's, and cover the global batch once."""
    global_batch = 11
    replicas = sum(counts)
    expected = _replica_slices(global_batch, replicas)
    first = 0
    for count in counts:
        dataset = elastic_dataset(tf.data.Dataset.range(global_batch * 3), global_batch,
                                  elastic.int64_variable(replicas), elastic.int64_variable(first),
                                  replica_devices=["/cpu:0"] * count if count > 1 else ())
        element = next(iter(dataset))
        parts = [element] if count == 1 else element.values
        assert [p.numpy().tolist() for p in parts] == expected[first:first + count]
        first += count


def test_a_worker_s_replicas_must_fit_in_the_job(elastic):
    dataset = elastic_dataset(tf.data.Dataset.range(20), 10, elastic.int64_variable(3),
                              elastic.int64_variable(2), replica_devices=["/cpu:0"] * 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="do not fit in the job's 3"):
        next(iter(dataset))


def test_an_iterator_of_several_replicas_is_traced_once_for_every_pass(elastic):
    dataset = elastic_dataset(tf.data.Dataset.range(8), 4, elastic.int64_variable(2),
                              elastic.int64_variable(0), replica_devices=["/cpu:0"] * 2)
    traces = []

    @tf.function
    def first_replica(iterator):
        traces.append(1)
        return iterator.get_next().values[0]

    assert first_replica(iter(dataset)).numpy().tolist() == [0, 1]
    assert first_replica(iter(dataset)).numpy().tolist() == [4, 5]
    assert len(traces) == 1


def test_distribute_batch_cuts_every_leaf():
    ids, labels = distribute_batch((tf.range(5), tf.range(5) * 10), ["/cpu:0", "/cpu:0"])
    assert [v.numpy().tolist() for v in ids.values] == [[0, 1, 2], [3, 4]]
    assert [v.numpy().tolist() for v in labels.values] == [[0, 10, 20], [30, 40]]


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_a_step_traced_for_the_replica_spec_serves_every_split(elastic, devices):
    """Traced once for `replica_element_spec` (as a newcomer does before it joins), a step
    takes the worker's batches whatever the job's replica count, without another trace."""
    traces = []

    @tf.function
    def step(batch):
        traces.append(1)
        return tf.nest.map_structure(tf.identity, batch)

    dataset = None
    for replicas in (devices, devices * 3, devices * 4):
        dataset = elastic_dataset(tf.data.Dataset.range(48), 12, elastic.int64_variable(replicas),
                                  elastic.int64_variable(0),
                                  replica_devices=["/cpu:0"] * devices if devices > 1 else ())
        if not traces:
            step.get_concrete_function(dataset.replica_element_spec)
        parts = step(next(iter(dataset)))
        parts = parts.values if devices > 1 else [parts]
        assert [len(p) for p in parts] == split_sizes(12, replicas)[:devices]
    assert len(traces) == 1
