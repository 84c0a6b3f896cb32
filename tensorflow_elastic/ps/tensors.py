"""Tensors on the wire as raw buffers: one bytes field per tensor, no per-element encoding.

Decoding does not copy: the arrays view the received message's buffer
(read-only), which is all the master needs to aggregate them.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

from tensorflow_elastic.proto import parameter_server_pb2 as pb


Raw = tuple[str, tuple[int, ...], bytes]

# Room for everything in a message besides the tensors' buffers (ids, shapes, dtype names).
MESSAGE_MARGIN_BYTES = 1 << 20


def message_limit(specs: Iterable[pb.VariableSpec]) -> int:
    """The largest message a PS or worker accepts for a model of ``specs``: twice its
    parameters' bytes plus a margin, so a message of the model's size always fits and a
    message far larger is refused before it is read."""
    parameters = sum(int(np.prod(tuple(s.shape), dtype=np.int64)) * np.dtype(s.dtype).itemsize
                     for s in specs)
    return 2 * parameters + MESSAGE_MARGIN_BYTES


def raw(array: np.ndarray) -> Raw:
    """(dtype name, shape, little-endian C-order buffer) of an array."""
    array = np.asarray(array)
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    return array.dtype.name, array.shape, np.ascontiguousarray(little).tobytes()


def add_raw(field: Any, raws: Iterable[Raw]) -> None:
    """Appends tensors to a repeated RawTensor field in place (building a RawTensor first and
    copying it in costs several times more for large buffers)."""
    for dtype, shape, data in raws:
        field.add(dtype=dtype, shape=shape, data=data)


def encode_into(field: Any, arrays: Iterable[np.ndarray]) -> None:
    add_raw(field, (raw(a) for a in arrays))


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


def first_non_finite(arrays: Sequence[np.ndarray]) -> int | None:
    """Index of the first array holding a NaN or an infinity (None: all finite); one pass
    over each floating-point buffer, none over integer ones."""
    for index, array in enumerate(arrays):
        if array.dtype.kind in "fc" and not np.isfinite(array).all():
            return index
    return None
