"""Iterator checkpoints: saved at one world size, restored at another; incompatible restores."""

import pytest
import tensorflow as tf


def consume(workers, steps):
    return [i for _ in range(steps) for worker in workers for i in worker.next_ids()]


def test_checkpoint_at_world_size_3_restores_at_world_size_2(elastic, source_kind, tmp_path):
    if source_kind == "stream_generator":
        pytest.skip("tf.data cannot checkpoint a Python generator (its state is in Python)")
    source = lambda: elastic.sources[source_kind](100)
    old = [elastic.make_worker(source(), 10, 3, rank) for rank in range(3)]
    seen = consume(old, 4)
    path = tf.train.Checkpoint(iterator=old[0].iterator).write(str(tmp_path / "chief"))
    # New processes, new variables at cursor 0: the checkpoint carries the cursor.
    new = [elastic.make_worker(source(), 10, 2, rank) for rank in range(2)]
    for worker in new:
        tf.train.Checkpoint(iterator=worker.iterator).read(path).assert_consumed()
        assert int(worker.dataset.cursor) == 4
    seen += consume(new, 6)
    assert seen == list(range(100))
    for worker in new:
        with pytest.raises(StopIteration):
            worker.next_ids()


@pytest.mark.parametrize("num_ids, global_batch, message", [
    (100, 12, "global_batch_size=10"),  # the cursor counts batches of another size
    (90, 10, "another input"),
])
def test_restore_into_an_incompatible_pipeline_is_refused(elastic, tmp_path, num_ids,
                                                          global_batch, message):
    worker = elastic.make_worker(tf.data.Dataset.range(100), 10, 2, 0)
    worker.next_ids()
    path = tf.train.Checkpoint(iterator=worker.iterator).write(str(tmp_path / "ckpt"))
    other = elastic.make_worker(tf.data.Dataset.range(num_ids), global_batch, 2, 0)
    with pytest.raises(tf.errors.FailedPreconditionError, match=message):
        tf.train.Checkpoint(iterator=other.iterator).read(path)


def test_rollback_is_an_assignment_of_the_cursor(elastic, source_kind):
    worker = elastic.make_worker(elastic.sources[source_kind](100), 10, 2, 1)
    committed = int(worker.dataset.cursor)
    first = [worker.next_ids() for _ in range(3)]
    worker.dataset.cursor.assign(committed)  # State.restore(), same iterator
    assert [worker.next_ids() for _ in range(3)] == first
