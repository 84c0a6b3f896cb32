"""TFRecord files of `tf.train.Example`s for the tests: example i carries its id and features."""

from __future__ import annotations

import os
from typing import Sequence

import tensorflow as tf

FEATURES = {"id": tf.io.FixedLenFeature([], tf.int64),
            "x": tf.io.FixedLenFeature([4], tf.float32)}


def example(i: int, extra: bool = False) -> bytes:
    feature = {"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
               "x": tf.train.Feature(float_list=tf.train.FloatList(
                   value=[float(i), i * 0.5, (i % 7) / 7.0, 1.0]))}
    if extra:
        feature["extra"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"y"]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_files(directory: str, counts: Sequence[int], compression: str | None = None,
                extra_in: int | None = None) -> list[str]:
    """Files of `counts[k]` examples each, ids consecutive across them; file `extra_in` has a
    feature more."""
    files, next_id = [], 0
    for k, count in enumerate(counts):
        path = os.path.join(directory, f"part-{k:03d}.tfrecord")
        with tf.io.TFRecordWriter(path, options=compression) as writer:
            for i in range(next_id, next_id + count):
                writer.write(example(i, extra=k == extra_in))
        next_id += count
        files.append(path)
    return files


def parse(record):
    parsed = tf.io.parse_single_example(record, FEATURES)
    return parsed["id"], parsed["x"]
