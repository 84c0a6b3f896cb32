"""The op's slicing: world-size changes land exactly at a global-batch boundary."""

import pytest
import tensorflow as tf


@pytest.mark.parametrize("autotune", [True, False], ids=["autotune_on", "autotune_off"])
def test_membership_changes_take_effect_at_the_next_global_batch(elastic, source_kind, autotune):
    source = elastic.with_autotune(elastic.sources[source_kind](60), autotune)
    worker = elastic.make_worker(source, global_batch_size=6, world_size=2, rank=0)
    # (world size, rank) for global batches 0, 1, 2, ...: grow, shrink, change rank only.
    schedule = [(2, 0), (3, 2), (3, 2), (4, 1), (2, 1), (1, 0), (5, 4), (3, 0)]
    for cursor, (world_size, rank) in enumerate(schedule):
        worker.join(world_size, rank)
        assert worker.next_ids() == elastic.expected_slice(cursor, 6, world_size, rank)
        assert int(worker.dataset.cursor) == cursor + 1


def test_uneven_global_batch_gives_the_first_ranks_one_more(elastic):
    batches = [elastic.make_worker(tf.data.Dataset.range(70), 7, 3, rank).next_ids()
               for rank in range(3)]
    assert batches == [[0, 1, 2], [3, 4], [5, 6]]


def test_last_partial_global_batch_is_clipped_and_may_be_empty(elastic, source_kind):
    # 23 ids, global batch 6: batch 3 holds 18..22, short by one.
    ids = []
    for rank in range(4):
        worker = elastic.make_worker(elastic.sources[source_kind](23), 6, 4, rank, cursor=3)
        batch = worker.next_ids()
        assert batch == elastic.expected_slice(3, 6, 4, rank, available=5)
        ids += batch
        with pytest.raises(StopIteration):
            worker.next_ids()
    assert ids == list(range(18, 23))


def test_an_empty_part_keeps_the_element_shape(elastic):
    source = tf.data.Dataset.range(10).map(lambda x: tf.fill([3], x))
    worker = elastic.make_worker(source, 8, 4, 3, cursor=1)
    batch = next(worker.iterator)
    assert batch.shape == (0, 3)


def test_drop_remainder_ends_the_pass_before_the_partial_batch(elastic, source_kind):
    source = elastic.sources[source_kind](23)
    worker = elastic.make_worker(source, 6, 2, 1, drop_remainder=True)
    batches = [batch.numpy().tolist() for batch in worker.iterator]
    assert batches == [[3, 4, 5], [9, 10, 11], [15, 16, 17]]
    # Global batches per pass, whatever the world size, when the input's size is known.
    known = int(source.cardinality()) >= 0
    assert int(worker.dataset.cardinality()) == (3 if known else tf.data.UNKNOWN_CARDINALITY)


def test_the_end_of_a_pass_resets_the_cursor_for_the_next_pass(elastic, source_kind):
    worker = elastic.make_worker(elastic.sources[source_kind](12), 4, 2, 0)
    first = [batch.numpy().tolist() for batch in worker.iterator]
    assert int(worker.dataset.cursor) == 0
    second = [batch.numpy().tolist() for batch in worker.dataset]
    assert first == second == [[0, 1], [4, 5], [8, 9]]


def test_a_traced_step_follows_the_membership_without_retracing(elastic):
    worker = elastic.make_worker(tf.data.Dataset.range(100), 10, 2, 0)
    traces = []

    @tf.function
    def step(iterator):
        traces.append(1)
        return next(iterator)

    seen = [step(worker.iterator).numpy().tolist()]
    worker.join(5, 3)
    seen.append(step(worker.iterator).numpy().tolist())
    assert seen == [list(range(0, 5)), list(range(16, 18))]
    assert len(traces) == 1


def test_elements_of_other_shapes_cannot_be_batched(elastic):
    source = tf.data.Dataset.range(1, 9).map(lambda x: tf.range(x))
    worker = elastic.make_worker(source, 4, 1, 0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="different shapes"):
        worker.next_ids()
