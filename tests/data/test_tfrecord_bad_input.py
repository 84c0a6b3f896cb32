"""Bad TFRecord input: a clear error naming the file and the offset, no hang, no crash."""

import logging
import os

import pytest
import tensorflow as tf

from tensorflow_elastic.data.addressable import addressable
from tensorflow_elastic.data.batched import distribute_batched
from tensorflow_elastic.data.tfrecord import TFRecordIndex
from tests.data.tfrecord_files import parse, write_files


@pytest.fixture
def files(tmp_path):
    return write_files(str(tmp_path), [5, 6])


def _pipeline(files, shuffle=True, **reader):
    dataset = tf.data.TFRecordDataset(files, **reader).map(parse)
    return (dataset.shuffle(8, seed=1) if shuffle else dataset).batch(4)


def _first_batch(elastic, pipeline):
    return next(iter(distribute_batched(pipeline, elastic.int64_variable(1),
                                        elastic.int64_variable(0))))


def _record_offsets(path):
    offsets, offset = [], 0
    for record in tf.data.TFRecordDataset([path]).as_numpy_iterator():
        offsets.append(offset)
        offset += 16 + len(record)
    return offsets


def _corrupt_the_data_of(path, record):
    """Flips a byte of the data of `record` in `path`; its offset."""
    offset = _record_offsets(path)[record]
    with open(path, "r+b") as f:
        f.seek(offset + 20)
        byte = f.read(1)
        f.seek(offset + 20)
        f.write(bytes([byte[0] ^ 0xFF]))
    return offset


def test_a_truncated_file(files, elastic):
    size = os.path.getsize(files[1])
    with open(files[1], "r+b") as f:
        f.truncate(size - 3)
    with pytest.raises(tf.errors.DataLossError,
                       match=rf"{files[1]}: truncated file: .* at offset \d+"):
        _first_batch(elastic, _pipeline(files))


def test_the_error_is_the_kernel_message_alone(files):
    """Without TensorFlow's function and op names around it: a user reads the file at once."""
    with open(files[0], "r+b") as f:
        f.truncate(os.path.getsize(files[0]) - 3)
    with pytest.raises(tf.errors.DataLossError) as raised:
        TFRecordIndex(files)
    assert str(raised.value).startswith(f"TFRecord file {files[0]}: truncated file")
    assert "function_node" not in str(raised.value) and "[Op:" not in str(raised.value)


def test_a_corrupt_length(files, elastic):
    offset = _record_offsets(files[0])[2]
    with open(files[0], "r+b") as f:
        f.seek(offset + 8)
        f.write(b"\0\0\0\0")
    with pytest.raises(tf.errors.DataLossError,
                       match=rf"{files[0]}: corrupt record .* at offset {offset}"):
        _first_batch(elastic, _pipeline(files))


def test_a_corrupt_record_is_found_when_read(files, elastic):
    offset = _corrupt_the_data_of(files[1], 3)
    dataset = distribute_batched(_pipeline(files), elastic.int64_variable(1),
                                 elastic.int64_variable(0))
    with pytest.raises(tf.errors.DataLossError,
                       match=rf"{files[1]}: corrupt record \(the CRC of its data does not "
                             rf"match\) at offset {offset}"):
        list(dataset)


def test_ignore_errors_skips_as_stock_tf_data_does_and_cannot_be_shuffled(files, elastic):
    """Only a user who asks skips records: the pipeline is then a stream (what the stock reader
    reads past a corrupt record is unknown in advance), refused with a shuffle."""
    _corrupt_the_data_of(files[1], 3)
    examples = tf.data.TFRecordDataset(files).map(parse).ignore_errors()
    stock = [int(i) for i, _ in examples]
    elastic_ids = [int(i) for ids, _ in distribute_batched(
        examples.batch(4), elastic.int64_variable(1), elastic.int64_variable(0)) for i in ids]
    assert elastic_ids == stock and 8 not in stock
    with pytest.raises(ValueError, match="not filter, ignore_errors"):
        _first_batch(elastic, examples.shuffle(8, seed=1).batch(4))


def test_a_missing_file(files, elastic):
    missing = files[0] + ".missing"
    with pytest.raises(tf.errors.NotFoundError, match=f"TFRecord file {missing}"):
        _first_batch(elastic, _pipeline([files[0], missing]))


def test_a_file_changed_under_a_kept_index(files, elastic):
    dataset = distribute_batched(_pipeline(files), elastic.int64_variable(1),
                                 elastic.int64_variable(0))
    assert dataset.batches_per_pass == 3  # the files are indexed
    # Rewritten in place with other records: the kept index no longer fits. (Rewritten before
    # the first read: the input reads ahead, and records read before the change are fine.)
    with tf.io.TFRecordWriter(files[0]) as writer:
        for i in range(5):
            writer.write(b"another record of another length %d" % i)
    with pytest.raises(tf.errors.DataLossError,
                       match=rf"{files[0]}: .*changed since it was indexed.* at offset \d+"):
        list(dataset)


def test_an_empty_file_list(elastic):
    with pytest.raises(ValueError, match="no files"):
        TFRecordIndex([])


def test_files_of_different_feature_specs(tmp_path, elastic):
    files = write_files(str(tmp_path), [3, 3], extra_in=1)
    with pytest.raises(ValueError, match=rf"different feature specs: .*{files[1]} has features "
                                         rf"\{{extra: bytes_list, .*{files[0]}"):
        _first_batch(elastic, _pipeline(files))


def test_compressed_files_stream_without_a_shuffle_and_are_refused_with_one(tmp_path, elastic,
                                                                             caplog):
    files = write_files(str(tmp_path), [5, 6], compression="GZIP")
    with pytest.raises(ValueError, match="GZIP-compressed.*decompress the files"):
        _first_batch(elastic, _pipeline(files, compression_type="GZIP"))
    plain = _pipeline(files, shuffle=False, compression_type="GZIP")
    with caplog.at_level(logging.WARNING):
        assert addressable(plain._input_dataset, shuffled=False) is plain._input_dataset
    assert "reads all of them as a stream" in caplog.text
    ids, _ = _first_batch(elastic, plain)
    assert ids.numpy().tolist() == [0, 1, 2, 3]


def test_a_compressed_file_read_as_uncompressed_says_so(tmp_path, elastic):
    files = write_files(str(tmp_path), [5], compression="GZIP")
    with pytest.raises(tf.errors.DataLossError, match="looks GZIP-compressed"):
        _first_batch(elastic, _pipeline(files))


def test_a_non_deterministic_interleave(files, elastic):
    pipeline = tf.data.Dataset.from_tensor_slices(files).interleave(
        tf.data.TFRecordDataset, cycle_length=2, num_parallel_calls=2,
        deterministic=False).map(parse).batch(4)
    with pytest.raises(ValueError, match="pass deterministic=True"):
        _first_batch(elastic, pipeline)
