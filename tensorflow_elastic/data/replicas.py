"""A worker's batches cut among its local replicas: one slice per device, as a PerReplica.

A worker that drives k devices receives the slices of its k replicas as one
contiguous batch (the elastic input op, `local_replicas=k`); the iterator here
cuts every batch again among the devices by the same rule as the whole job's,
so each replica gets its own slice of the global batch. It is a composite
tensor, as tf.data's own iterators: Keras passes it into its traced training
function, which then serves every epoch's iterator without a retrace.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf
from tensorflow.python.data.ops import iterator_ops
from tensorflow.python.distribute import values as values_lib
from tensorflow.python.framework import type_spec


def split_sizes(size, parts: int):
    """A batch of `size` elements cut among `parts` replicas: the first `size % parts` take one
    more. On a full global batch this is the job's own rule (in both, the replicas with the
    extra elements come first), so every replica gets exactly its slice of the global batch.
    A Python int gives a list, a tensor a tensor."""
    if isinstance(size, int):
        return [size // parts + (1 if i < size % parts else 0) for i in range(parts)]
    return size // parts + tf.cast(tf.range(parts, dtype=size.dtype) < size % parts, size.dtype)


class InputSlices(values_lib.PerReplica):
    """A worker's input batch as its replicas' slices (what ReplicaIterator hands out).

    Told apart from values the replicas computed: reducing it across the job means nothing
    (see ElasticMultiWorkerMirroredStrategy.reduce).
    """


def distribute_batch(element, devices: Sequence[str]):
    """`element` (a structure of batches along their first axis) as one InputSlices per leaf,
    each replica's part on its device."""
    def cut(batch):
        batch = tf.convert_to_tensor(batch)
        sizes = split_sizes(tf.shape(batch, out_type=tf.int64)[0], len(devices))
        parts = tf.split(batch, sizes, num=len(devices))
        placed = []
        for device, part in zip(devices, parts):
            with tf.device(device):
                placed.append(tf.identity(part))
        return InputSlices(placed)

    return tf.nest.map_structure(cut, element)


def replica_spec(element_spec, replicas: int):
    """The spec of what a worker's iterator hands out for `element_spec` (its batches' spec):
    the batches themselves with one replica, one PerReplicaSpec per leaf with several, each
    slice of unknown size. A step traced for it serves every split of the global batch."""
    if replicas <= 1:
        return element_spec
    return tf.nest.map_structure(
        lambda spec: values_lib.PerReplicaSpec(
            *[tf.TensorSpec([None, *spec.shape[1:]], spec.dtype)] * replicas),
        element_spec)


class ReplicaIterator(iterator_ops.IteratorBase):
    """An iterator over a worker's batches whose elements are cut among its `devices`."""

    def __init__(self, iterator: iterator_ops.OwnedIterator, devices: Sequence[str]):
        self._iterator = iterator
        self._devices = tuple(devices)

    def __iter__(self):
        return self

    def __next__(self):
        return distribute_batch(next(self._iterator), self._devices)

    def get_next(self):
        return distribute_batch(self._iterator.get_next(), self._devices)

    def get_next_as_optional(self):
        raise NotImplementedError(
            "a worker with several local replicas hands out its batches one at a time: use "
            "steps_per_execution=1 (Keras' default)")

    @property
    def element_spec(self):
        """The spec of the worker's whole batch, before it is cut among the replicas."""
        return self._iterator.element_spec

    @property
    def _type_spec(self):
        return ReplicaIteratorSpec(self._iterator._type_spec, self._devices)  # noqa: SLF001


class ReplicaIteratorSpec(type_spec.TypeSpec):
    """The type of a ReplicaIterator: its tf.data iterator's, plus the devices."""

    __slots__ = ["_iterator_spec", "_devices"]

    def __init__(self, iterator_spec, devices: tuple[str, ...]):
        self._iterator_spec = iterator_spec
        self._devices = tuple(devices)

    @property
    def value_type(self):
        return ReplicaIterator

    def _serialize(self):
        return (self._iterator_spec, self._devices)

    @property
    def _component_specs(self):
        return self._iterator_spec

    def _to_components(self, value):
        return value._iterator  # noqa: SLF001

    def _from_components(self, components):
        return ReplicaIterator(components, self._devices)
