"""TFRecord pipelines as users write them, read by record index: the same records in the same
order as stock tf.data, each worker reading only its own, a newcomer entering at any cursor."""

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_elastic.data import tfrecord_records
from tensorflow_elastic.data.addressable import addressable
from tensorflow_elastic.data.batched import distribute_batched, global_batches_per_pass
from tensorflow_elastic.data.tfrecord import TFRecordIndex
from tests.data.tfrecord_files import parse, write_files

COUNTS = [7, 0, 12, 3, 9, 5]  # an empty file among files of different sizes


@pytest.fixture
def files(tmp_path):
    return write_files(str(tmp_path), COUNTS)


def _ids(dataset):
    return [int(element[0]) for element in dataset.as_numpy_iterator()]


def test_the_records_are_the_files_records_in_order(files):
    stock = list(tf.data.TFRecordDataset(files).as_numpy_iterator())
    assert list(tfrecord_records(files).as_numpy_iterator()) == stock
    assert int(tfrecord_records(files).cardinality()) == sum(COUNTS)


@pytest.mark.parametrize("reader", [
    "direct", "parallel_reads", "interleave", "interleave_blocks", "parallel_interleave",
    "flat_map",
])
def test_a_pipeline_is_rebuilt_with_the_stock_order(files, reader):
    names = tf.data.Dataset.from_tensor_slices(files)
    records = {
        "direct": lambda: tf.data.TFRecordDataset(files),
        "parallel_reads": lambda: tf.data.TFRecordDataset(files, num_parallel_reads=3),
        "interleave": lambda: names.interleave(tf.data.TFRecordDataset, cycle_length=4,
                                               deterministic=True),
        "interleave_blocks": lambda: names.interleave(tf.data.TFRecordDataset, cycle_length=3,
                                                      block_length=2),
        "parallel_interleave": lambda: names.interleave(
            tf.data.TFRecordDataset, cycle_length=3, num_parallel_calls=2, deterministic=True),
        "flat_map": lambda: names.flat_map(tf.data.TFRecordDataset),
    }[reader]
    stock = records().map(parse)
    rebuilt = addressable(stock, shuffled=False)
    assert rebuilt is not stock
    assert rebuilt.cardinality() == sum(COUNTS)  # known: it supports random access
    assert _ids(rebuilt) == _ids(stock)


def test_a_shuffled_pipeline_gives_each_worker_its_slice_of_one_order(files, elastic):
    def pipeline():
        return tf.data.TFRecordDataset(files).map(parse).shuffle(16, seed=7).batch(6)

    def worker(world, rank):
        return distribute_batched(pipeline(), elastic.int64_variable(world),
                                  elastic.int64_variable(rank))

    workers = [worker(2, 0), worker(2, 1)]
    batches = [[ids.numpy().tolist() for ids, _ in w] for w in workers]
    single = [ids.numpy().tolist() for ids, _ in worker(1, 0)]
    assert [a + b for a, b in zip(*batches)] == single
    assert sorted(i for batch in single for i in batch) == list(range(sum(COUNTS)))
    assert [i for batch in single for i in batch] != list(range(sum(COUNTS)))
    # A newcomer at global batch 3 of epoch 1 reads that epoch's order from there.
    epoch_1 = worker(1, 0)
    epoch_1.seek(0, epoch=1)
    whole = [ids.numpy().tolist() for ids, _ in epoch_1]
    assert whole != single
    newcomer = worker(1, 0)
    newcomer.seek(3, epoch=1)
    assert [ids.numpy().tolist() for ids, _ in newcomer] == whole[3:]


def test_the_index_is_kept_in_a_cache_directory(files, tmp_path):
    cache = tmp_path / "cache"
    index = TFRecordIndex(files, cache_dir=str(cache))
    assert len(list(cache.iterdir())) == len(files)
    assert index.counts.tolist() == COUNTS
    # Appending a record changes the file's size: it is indexed anew.
    with tf.io.TFRecordWriter(files[0] + ".new") as writer:
        for record in tf.data.TFRecordDataset(files[:1]).as_numpy_iterator():
            writer.write(record)
        writer.write(b"one more")
    tf.io.gfile.rename(files[0] + ".new", files[0], overwrite=True)
    assert TFRecordIndex(files, cache_dir=str(cache)).counts.tolist()[0] == COUNTS[0] + 1
    assert TFRecordIndex(files, cache_dir=str(cache)).read(COUNTS[0]) == b"one more"


def test_other_pipelines_are_left_as_they_are(files):
    streams = [tf.data.TFRecordDataset(files).filter(lambda r: True).map(parse),
               tf.data.Dataset.range(5),
               tf.data.Dataset.from_tensor_slices(files).interleave(
                   lambda f: tf.data.TFRecordDataset(f).map(parse), cycle_length=2)]
    for stream in streams:
        assert addressable(stream, shuffled=False) is stream


def test_a_pass_is_counted_though_stock_tf_data_cannot(files):
    pipeline = tf.data.TFRecordDataset(files).map(parse).shuffle(8, seed=1).batch(6)
    assert int(pipeline.cardinality()) < 0
    assert global_batches_per_pass(pipeline) == -(-sum(COUNTS) // 6)
    assert global_batches_per_pass(tf.data.Dataset.range(9).filter(lambda x: True).batch(2)) \
        is None
