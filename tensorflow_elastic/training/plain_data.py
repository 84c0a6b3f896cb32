"""The format members exchange a State's Python values in: plain data, never code.

Bytes a peer puts through the orchestrator (or anyone who can write to its
store) reach every member, so nothing here may deserialise into an object
that runs code (as a pickle's `__reduce__` does). JSON, with tags for the few
types JSON lacks, and a schema check on the way in.
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import numpy as np

# A State's Python values are counters and small settings; a peer's oversized blob is refused.
MAX_BYTES = 16 * 2**20
_TAG = "__tfe__"
# Types encode() takes as they are (None too).
_SCALARS = (bool, int, float, str)


class NotPlainData(ValueError):
    """A value that is not plain data, or bytes that do not decode to plain data."""


def encode(value: Any) -> bytes:
    """`value` (numbers, strings, bytes, None, lists, tuples, dicts with string keys, numpy
    arrays and scalars of numbers) as bytes; `decode` gives back the same types. A subclass
    (a defaultdict, a namedtuple) is refused rather than changed into its base."""
    converted = _to_json(value, "value")
    try:
        return json.dumps(converted, allow_nan=True, separators=(",", ":")).encode()
    except ValueError as e:  # an int too long for JSON's text
        raise NotPlainData(f"value cannot be written as plain data: {e}") from None


def check(value: Any) -> None:
    """NotPlainData unless `encode` takes `value`. A dict of scalars (a State's step count, at
    every commit) is checked without encoding it: the encoding cost 10-50 us a commit, the
    largest part of a small model's."""
    if type(value) is dict and _TAG not in value and all(
            type(k) is str and (v is None or type(v) in _SCALARS)
            and (type(v) is not int or v.bit_length() <= 64) for k, v in value.items()):
        return
    encode(value)


def decode(blob: bytes) -> Any:
    """What `encode` gave; NotPlainData for anything else."""
    if len(blob) > MAX_BYTES:
        raise NotPlainData(f"{len(blob)} bytes of exchanged state: more than {MAX_BYTES}")
    try:
        raw = json.loads(blob.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise NotPlainData(f"exchanged state is not plain data ({e}); every member must run "
                           f"the same tensorflow_elastic") from None
    return _from_json(raw)


def _to_json(value: Any, where: str) -> Any:
    kind = type(value)
    if value is None or kind in _SCALARS:
        return value
    if kind is bytes:
        return {_TAG: "bytes", "base64": base64.b64encode(value).decode()}
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        return {_TAG: "scalar", "dtype": value.dtype.str, "value": value.item()}
    if kind is np.ndarray and value.dtype.kind in "biuf":
        return {_TAG: "ndarray", "dtype": value.dtype.str, "shape": list(value.shape),
                "values": value.ravel().tolist()}
    if kind is list:
        return [_to_json(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if kind is tuple:
        return {_TAG: "tuple", "values": [_to_json(v, f"{where}[{i}]")
                                          for i, v in enumerate(value)]}
    if kind is dict:
        if not all(isinstance(k, str) for k in value):
            raise NotPlainData(f"{where} has a key that is not a string: a State's values "
                               f"must be plain data")
        if _TAG in value:
            raise NotPlainData(f"{where} uses the reserved key {_TAG!r}")
        return {k: _to_json(v, f"{where}[{k!r}]") for k, v in value.items()}
    raise NotPlainData(f"{where} is a {kind.__name__}: a State's values must be plain data "
                       f"(numbers, strings, bytes, None, lists, tuples, dicts with string "
                       f"keys, numpy arrays of numbers; a tensor: its .numpy()); keep other "
                       f"objects outside the State")


def _from_json(raw: Any) -> Any:
    if raw is None or isinstance(raw, (bool, int, float, str)):
        return raw
    if isinstance(raw, list):
        return [_from_json(v) for v in raw]
    if not isinstance(raw, dict):
        raise NotPlainData(f"unexpected {type(raw).__name__} in exchanged state")
    tag = raw.get(_TAG)
    if tag is None:
        return {k: _from_json(v) for k, v in raw.items()}
    if tag == "tuple" and isinstance(raw.get("values"), list):
        return tuple(_from_json(v) for v in raw["values"])
    if tag == "ndarray":
        return _array(raw)
    if tag == "scalar":
        return _array({"dtype": raw.get("dtype"), "shape": [],
                       "values": [raw.get("value")]})[()]
    if tag == "bytes" and isinstance(raw.get("base64"), str):
        try:
            return base64.b64decode(raw["base64"], validate=True)
        except ValueError:
            raise NotPlainData("malformed bytes in exchanged state") from None
    raise NotPlainData(f"unknown tag {tag!r} in exchanged state")


def _array(raw: dict) -> np.ndarray:
    try:
        dtype = np.dtype(raw["dtype"])
        shape = [int(n) for n in raw["shape"]]
        values = raw["values"]
    except (KeyError, TypeError, ValueError) as e:
        raise NotPlainData(f"a malformed array in exchanged state ({e})") from None
    if dtype.kind not in "biuf" or not isinstance(values, list) \
            or any(n < 0 for n in shape) or len(values) != math.prod(shape) \
            or not all(isinstance(v, (bool, int, float)) for v in values):
        raise NotPlainData("a malformed array in exchanged state")
    return np.array(values, dtype=dtype).reshape(shape)
