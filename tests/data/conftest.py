"""Helpers for the elastic input tests: simulated workers in one process.

A simulated worker is what a real one holds: its own world-size, rank and
cursor variables and one iterator over its own elastic dataset.
"""

from __future__ import annotations

import dataclasses

import pytest
import tensorflow as tf

from tensorflow_elastic import ops
from tensorflow_elastic.data import ElasticDataset


def int64_variable(value: int) -> tf.Variable:
    with tf.device("/cpu:0"):
        return tf.Variable(value, dtype=tf.int64, trainable=False)


def with_autotune(dataset: tf.data.Dataset, autotune: bool) -> tf.data.Dataset:
    options = tf.data.Options()
    options.autotune.enabled = autotune
    return dataset.with_options(options)


# Sources of the ids 0..n-1: index-addressable ones and streaming ones.
SOURCES = {
    "range": lambda n: tf.data.Dataset.range(n),
    "tensor_slices": lambda n: tf.data.Dataset.from_tensor_slices(tf.range(n, dtype=tf.int64)),
    "parallel_map_prefetch": lambda n: tf.data.Dataset.range(n).map(
        lambda x: x, num_parallel_calls=tf.data.AUTOTUNE).prefetch(4),
    "stream_filter": lambda n: tf.data.Dataset.range(n).filter(lambda x: x >= 0),
    "stream_generator": lambda n: tf.data.Dataset.from_generator(
        lambda: iter(range(n)), output_signature=tf.TensorSpec([], tf.int64)),
}


@dataclasses.dataclass
class Worker:
    dataset: ElasticDataset
    iterator: object

    def next_ids(self) -> list[int]:
        return next(self.iterator).numpy().tolist()

    def join(self, world_size: int, rank: int) -> None:
        """What the strategy does at a re-form: assign the new membership."""
        self.dataset.world_size.assign(world_size)
        self.dataset.rank.assign(rank)


def make_worker(source: tf.data.Dataset, global_batch_size: int, world_size: int, rank: int,
                cursor: int = 0, drop_remainder: bool = False) -> Worker:
    dataset = ElasticDataset(source, global_batch_size, int64_variable(world_size),
                             int64_variable(rank), int64_variable(cursor), drop_remainder)
    return Worker(dataset, iter(dataset))


def expected_slice(cursor: int, global_batch_size: int, world_size: int, rank: int,
                   available: int | None = None) -> list[int]:
    """The oracle: the GlobalBatchSlice rule, clipped to the elements that exist."""
    start, size = (int(t) for t in ops.global_batch_slice(cursor, global_batch_size,
                                                          world_size, rank))
    end = start + size
    if available is not None:
        end = min(end, cursor * global_batch_size + available)
    return list(range(start, max(start, end)))


class Helpers:
    """The helpers above, handed to tests as the `elastic` fixture."""

    sources = SOURCES
    int64_variable = staticmethod(int64_variable)
    with_autotune = staticmethod(with_autotune)
    make_worker = staticmethod(make_worker)
    expected_slice = staticmethod(expected_slice)


@pytest.fixture
def elastic() -> type[Helpers]:
    return Helpers


@pytest.fixture(params=sorted(SOURCES))
def source_kind(request) -> str:
    return request.param
