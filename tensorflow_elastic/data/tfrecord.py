"""TFRecord files read by record index: what lets the elastic input enter them at any record.

The index (each record's offset and length) comes from the C++ op
`TFRecordIndex` (cc/kernels/tfrecord_index.cc): read from the length headers
only, in parallel across files, and kept in memory, and in `cache_dir` if one
is given, under each file's size and modification time. The records are read
by `TFRecordRead`, one at its offset, both CRCs checked. Paths go through
TensorFlow's file systems, so whatever `tf.io.gfile` reaches works.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Iterator, Sequence

import numpy as np
import tensorflow as tf

from tensorflow_elastic import environment
from tensorflow_elastic.ops import load_op_library


class TFRecordIndex:
    """Where every record of `files` lies, in the order `order` gives (file after file if None).

    `order[k]` is the position, in the concatenation of the files, of record k.
    """

    def __init__(self, files: Sequence[str], cache_dir: str | None = None):
        self.files = [os.fspath(f) for f in files]
        if not self.files:
            raise ValueError("the TFRecord input has no files: give TFRecordDataset a non-empty "
                             "list of file names")
        if cache_dir is None:
            cache_dir = environment.text(environment.TFRECORD_INDEX_DIR, "")
        with tf.init_scope(), tf.device("/cpu:0"), _plain_errors():
            counts, offsets, lengths = load_op_library().tf_record_index(
                tf.constant(self.files, tf.string), tf.constant(cache_dir, tf.string))
        self.counts = counts.numpy()
        self.offsets = offsets.numpy()
        self.lengths = lengths.numpy()
        self.file_ids = np.repeat(np.arange(len(self.files), dtype=np.int64), self.counts)

    @property
    def size(self) -> int:
        return int(self.offsets.size)

    def file_starts(self) -> np.ndarray:
        """The position of each file's first record in the concatenation."""
        return np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)

    def records(self, order: np.ndarray | None = None) -> tf.data.Dataset:
        """The serialized records, record k at position `order[k]` of the concatenation:
        a map over a range, so it supports random access."""
        file_ids, offsets, lengths = self.file_ids, self.offsets, self.lengths
        if order is not None:
            file_ids, offsets, lengths = file_ids[order], offsets[order], lengths[order]
        with tf.init_scope(), tf.device("/cpu:0"):
            names = tf.constant(self.files, tf.string)
            file_ids, offsets, lengths = (tf.constant(a, tf.int64)
                                          for a in (file_ids, offsets, lengths))
        read = load_op_library().tf_record_read

        @tf.autograph.experimental.do_not_convert
        def read_record(index):
            return read(names, file_ids, offsets, lengths, index)

        return tf.data.Dataset.range(self.size).map(read_record)

    def read(self, position: int) -> bytes:
        """Record `position` of the concatenation, read eagerly."""
        with tf.init_scope(), tf.device("/cpu:0"), _plain_errors():
            return load_op_library().tf_record_read(
                tf.constant(self.files), tf.constant(self.file_ids), tf.constant(self.offsets),
                tf.constant(self.lengths), tf.constant(position, tf.int64)).numpy()

    def check_same_features(self) -> None:
        """Raises ValueError naming two files whose first `tf.train.Example`s have different
        features (names or kinds): a parse written for one would fail, late, on the other.
        Records that are not Examples are not checked."""
        first: tuple[str, dict[str, str]] | None = None
        for file, start, count in zip(self.files, self.file_starts(), self.counts):
            if count == 0:
                continue
            features = _example_features(self.read(int(start)))
            if features is None:
                return
            if first is None:
                first = (file, features)
            elif features != first[1]:
                raise ValueError(
                    f"TFRecord files of different feature specs: the record at offset 0 of "
                    f"{file} has features {_describe(features)}, the one of {first[0]} has "
                    f"{_describe(first[1])}; give the input files of one kind")


# What an eager op's error adds around the kernel's message: the function it ran in (with this
# worker's device name) and the op's name. Neither helps a user find the bad file.
_EAGER_PREFIX = re.compile(r"^\{\{function_node [^}]*\}\}\s*")
_EAGER_SUFFIX = re.compile(r"\s*\[Op:\w+\](?: name: \S*)?\s*$")


@contextlib.contextmanager
def _plain_errors() -> Iterator[None]:
    """Re-raises an op's error (same class) with the kernel's message alone: the file and offset."""
    try:
        yield
    except tf.errors.OpError as error:
        message = _EAGER_SUFFIX.sub("", _EAGER_PREFIX.sub("", error.message))
        if message == error.message:
            raise
        raise type(error)(error.node_def, error.op, message) from None


def _example_features(record: bytes) -> dict[str, str] | None:
    """{feature name: kind} of a serialized tf.train.Example, None for another record."""
    try:
        example = tf.train.Example.FromString(record)
    except Exception:  # pylint: disable=broad-except  (not an Example: nothing to compare)
        return None
    return {name: feature.WhichOneof("kind") or "empty"
            for name, feature in example.features.feature.items()}


def _describe(features: dict[str, str]) -> str:
    return "{" + ", ".join(f"{name}: {kind}" for name, kind in sorted(features.items())) + "}"


def tfrecord_records(files: Sequence[str], cache_dir: str | None = None) -> tf.data.Dataset:
    """The records of uncompressed TFRecord `files`, file after file, addressable by index:
    the elastic input reads only this worker's records, and enters them at any cursor.

    `cache_dir` (default: the TFE_TFRECORD_INDEX_DIR environment variable) keeps the
    index between processes.
    """
    return TFRecordIndex(files, cache_dir).records()
