"""Tensors on the wire as raw buffers: one bytes field per tensor, no per-element encoding.

Decoding does not copy: the arrays view the received message's buffer
(read-only), which is all the master needs to aggregate them.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from tensorflow_elastic.proto import parameter_server_pb2 as pb


def encode(array: np.ndarray) -> pb.RawTensor:
    array = np.asarray(array)
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    return pb.RawTensor(dtype=array.dtype.name, shape=array.shape,
                        data=np.ascontiguousarray(little).tobytes())


def encode_all(arrays: Iterable[np.ndarray]) -> list[pb.RawTensor]:
    return [encode(a) for a in arrays]


def decode(tensor: pb.RawTensor) -> np.ndarray:
    """The array a RawTensor holds; ValueError when its buffer does not match its shape."""
    try:
        dtype = np.dtype(tensor.dtype).newbyteorder("<")
    except TypeError:
        raise ValueError(f"unknown dtype {tensor.dtype!r}") from None
    shape = tuple(tensor.shape)
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(tensor.data) != expected:
        raise ValueError(f"a {tensor.dtype}{list(shape)} tensor needs {expected} bytes, "
                         f"got {len(tensor.data)}")
    return np.frombuffer(tensor.data, dtype=dtype).reshape(shape)


def decode_all(tensors: Sequence[pb.RawTensor]) -> list[np.ndarray]:
    return [decode(t) for t in tensors]
