"""The look-ahead of an indexed input: batches prepared in parallel ahead of the step.

It runs on as many threads as tf.data's thread pool has (each cutting whole
batches), holds at most max(2, threads) batches, and whatever it prepared is
dropped when the membership or the cursor changes.
"""

import time

import pytest
import tensorflow as tf


def counted_source(num_ids, counter, autotune, threads):
    """Ids 0..n-1 that count their reads, on a private pool of `threads` threads."""
    def count(x):
        counter.assign_add(1)
        return x

    options = tf.data.Options()
    options.autotune.enabled = autotune
    options.threading.private_threadpool_size = threads
    return tf.data.Dataset.range(num_ids).map(count).with_options(options)


def wait_for(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the look-ahead did not get there"
        time.sleep(0.01)


AUTOTUNE = pytest.mark.parametrize("autotune", [True, False],
                                   ids=["autotune_on", "autotune_off"])
THREADS = pytest.mark.parametrize("threads", [1, 3], ids=["1_thread", "3_threads"])


@AUTOTUNE
@THREADS
def test_the_lookahead_prepares_a_bounded_number_of_batches_ahead(elastic, autotune, threads):
    counter = tf.Variable(0, dtype=tf.int64)
    worker = elastic.make_worker(counted_source(1000, counter, autotune, threads), 10, 2, 0)
    assert worker.next_ids() == list(range(5))
    # The step's own slice, then the slices of the next max(2, threads) global batches.
    window = max(2, threads)
    wait_for(lambda: int(counter) == 5 * (1 + window))
    time.sleep(0.2)
    assert int(counter) == 5 * (1 + window)
    for cursor in range(1, 6):
        assert worker.next_ids() == elastic.expected_slice(cursor, 10, 2, 0)
    wait_for(lambda: int(counter) == 5 * (6 + window))


@AUTOTUNE
@THREADS
def test_changes_while_batches_are_prepared_ahead_are_exact(elastic, autotune, threads):
    counter = tf.Variable(0, dtype=tf.int64)
    worker = elastic.make_worker(counted_source(600, counter, autotune, threads), 12, 2, 1)
    # (world size, rank, cursor to roll back to or None) before each batch.
    schedule = [(2, 1, None), (2, 1, None), (3, 0, None), (3, 0, None), (3, 0, 1),
                (3, 0, None), (4, 3, None), (4, 3, 2), (1, 0, None), (1, 0, None)]
    for world_size, rank, rollback in schedule:
        time.sleep(0.05)  # a step: the look-ahead fills meanwhile
        worker.join(world_size, rank)
        if rollback is not None:
            worker.dataset.cursor.assign(rollback)
        cursor = int(worker.dataset.cursor)
        assert worker.next_ids() == elastic.expected_slice(cursor, 12, world_size, rank)
        assert int(worker.dataset.cursor) == cursor + 1


@AUTOTUNE
def test_a_whole_pass_with_several_producers_is_in_order(elastic, autotune):
    counter = tf.Variable(0, dtype=tf.int64)
    worker = elastic.make_worker(counted_source(1003, counter, autotune, 3), 10, 3, 2)
    batches = [batch.numpy().tolist() for batch in worker.iterator]
    expected = [elastic.expected_slice(cursor, 10, 3, 2, available=min(10, 1003 - 10 * cursor))
                for cursor in range(101)]
    assert batches == expected
    assert int(worker.dataset.cursor) == 0


@AUTOTUNE
def test_an_error_in_a_batch_prepared_ahead_surfaces_at_its_hand_out(elastic, autotune):
    def fail_at_57(x):
        tf.debugging.assert_none_equal(x, tf.constant(57, tf.int64), message="bad record")
        return x

    source = elastic.with_autotune(tf.data.Dataset.range(100).map(fail_at_57), autotune)
    worker = elastic.make_worker(source, 10, 1, 0)
    for cursor in range(5):
        time.sleep(0.05)
        assert worker.next_ids() == list(range(10 * cursor, 10 * cursor + 10))
    for _ in range(2):  # the cursor stays at the failing batch
        with pytest.raises(tf.errors.InvalidArgumentError, match="bad record"):
            worker.next_ids()
        assert int(worker.dataset.cursor) == 5
    worker.dataset.cursor.assign(6)
    assert worker.next_ids() == list(range(60, 70))
