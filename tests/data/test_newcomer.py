"""A newcomer starts at the cursor: without replay for index-addressable inputs."""

import tensorflow as tf

from tensorflow_elastic.data import indexed_records


def counting(dataset, counter):
    """Counts the elements the input actually produces.

    The look-ahead prepares max(2, threads of tf.data's pool) batches: two
    with this pool.
    """
    def count(x):
        counter.assign_add(1)
        return x

    options = tf.data.Options()
    options.threading.private_threadpool_size = 2
    return dataset.map(count).with_options(options)


def test_an_index_addressable_newcomer_reads_only_its_slice(elastic):
    counter = tf.Variable(0, dtype=tf.int64)
    source = counting(tf.data.Dataset.range(100_000), counter)
    worker = elastic.make_worker(source, 10, 2, 1, cursor=5_000)
    assert worker.next_ids() == list(range(50_005, 50_010))
    # Its slice and at most the two next ones (prepared ahead), not the 50,005 before it.
    assert 5 <= int(counter) <= 15


def test_a_streaming_newcomer_fast_forwards_through_the_stream(elastic):
    counter = tf.Variable(0, dtype=tf.int64)
    source = counting(tf.data.Dataset.range(1_000), counter).filter(lambda x: x >= 0)
    worker = elastic.make_worker(source, 10, 2, 1, cursor=50)
    assert worker.next_ids() == list(range(505, 510))
    assert int(counter) >= 505  # the documented O(cursor) fast-forward


def test_indexed_records_address_records_across_files(elastic):
    files, sizes = ["a", "b", "c"], [3, 0, 4]
    source = indexed_records(files, sizes, lambda name, offset: (name, offset))
    assert [(name.decode(), int(offset)) for name, offset in source.as_numpy_iterator()] == [
        ("a", 0), ("a", 1), ("a", 2), ("c", 0), ("c", 1), ("c", 2), ("c", 3)]
    # Global batch 1 is records 4..6 (partial); rank 0 of 2 takes 4 and 5.
    worker = elastic.make_worker(source, 4, 2, 0, cursor=1)
    names, offsets = next(worker.iterator)
    assert names.numpy().tolist() == [b"c", b"c"] and offsets.numpy().tolist() == [1, 2]


def test_indexed_records_are_index_addressable(elastic):
    counter = tf.Variable(0, dtype=tf.int64)

    def read(name, offset):
        counter.assign_add(1)
        return offset

    options = tf.data.Options()
    options.threading.private_threadpool_size = 2  # two batches ahead, as above
    source = indexed_records(["a", "b"], [50_000, 50_000], read).with_options(options)
    worker = elastic.make_worker(source, 10, 1, 0, cursor=7_000)
    assert worker.next_ids() == list(range(20_000, 20_010))
    assert 10 <= int(counter) <= 30
