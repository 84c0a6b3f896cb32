"""A state's layout (each variable's name, shape and dtype, in order) and the members' check of it.

Before a sync sends any variable, every member's layout must equal the
source's. Members exchange a digest, a few dozen bytes whatever the model
(a Keras model with Adam has over a thousand variables, past what the
orchestrator takes in one value); only when digests differ do they exchange
the layouts themselves, compressed and cut to a bounded size, to say where
they differ.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from typing import Any, Protocol

import tensorflow as tf

from tensorflow_elastic.errors import GenerationEnded, StateLayoutMismatch
from tensorflow_elastic.training import plain_data

Entry = tuple[str, tuple, str]

# The compressed layouts exchanged after a mismatch stay under this (the orchestrator takes
# 64 KiB per value by default; base64 adds a third).
DETAIL_BYTES = 36 * 1024
# A member's compressed layout may not expand past this when read.
MAX_EXPANDED_BYTES = 16 * 2**20


class Exchange(Protocol):
    node_id: int

    def exchange(self, topic: str, value: bytes) -> dict[int, bytes]: ...


def describe(variables: list[tf.Variable]) -> list[Entry]:
    """What a sync needs equal on every member: each variable's name, shape and dtype, in order."""
    # Keras 3 variables give their shape as a tuple and their dtype as a string.
    return [(getattr(v, "path", None) or v.name, tuple(tf.TensorShape(v.shape).as_list()),
             tf.as_dtype(v.dtype).name) for v in variables]


def check(job: Exchange, mine: list[Entry], source: int,
          exchanged: dict[int, bytes] | None = None) -> None:
    """Compares every member's state layout with the source's (this node's is `mine`) before
    any variable is sent. `exchanged`: every member's digest() when the sync has gathered
    them already (with its other values: one exchange less); otherwise they are exchanged here.

    A node whose layout differs raises StateLayoutMismatch naming the first
    variable that differs (it then leaves); the others raise GenerationEnded
    and re-form without it. Without this check the sync's broadcast fails
    with a mismatch, and only where the differing node takes part.
    """
    if exchanged is None:
        exchanged = job.exchange("layout", digest(mine))
    digests = {node_id: _digest_message(blob) for node_id, blob in exchanged.items()}
    differing = sorted(node_id for node_id, digest in digests.items()
                       if digest != digests[source])
    if not differing:
        return
    details = {node_id: _detail_message(blob) for node_id, blob in
               job.exchange("layout-detail", detail(mine)).items()}
    if job.node_id in differing:
        expected, count = details[source], digests[source]["variables"]
        raise StateLayoutMismatch(
            f"this node's state differs from the members' "
            f"{first_difference(mine, expected, 'the members have', count)}. Build the same "
            f"model, optimizer and inputs on every node (same code, same order) before training")
    raise GenerationEnded(f"node(s) {differing} hold a different state layout; they leave")


def first_difference(mine: list, expected: list, theirs: str, count: int | None = None) -> str:
    """Where two layouts first differ, for an error message. `expected` may be the first
    entries of a layout of `count` (a cut one)."""
    count = len(expected) if count is None else count
    first = next((i for i, (a, b) in enumerate(zip(mine, expected)) if a != b),
                 min(len(mine), len(expected)))
    if first == len(expected) < count:
        return (f"after variable #{first - 1}: the first {first} agree ({len(mine)} vs "
                f"{count} variables)")
    have = mine[first] if first < len(mine) else "nothing"
    want = expected[first] if first < len(expected) else "nothing"
    return (f"at variable #{first}: it has {have}, {theirs} {want} ({len(mine)} vs "
            f"{count} variables)")


def digest(layout: list[Entry]) -> bytes:
    """What a member exchanges first: its layout's size and hash."""
    text = json.dumps(layout, separators=(",", ":")).encode()
    return plain_data.encode({"variables": len(layout),
                              "sha256": hashlib.sha256(text).hexdigest()})


def _digest_message(blob: bytes) -> dict[str, Any]:
    message = plain_data.decode(blob)
    if (not isinstance(message, dict) or set(message) != {"variables", "sha256"}
            or type(message["variables"]) is not int or not isinstance(message["sha256"], str)):
        raise plain_data.NotPlainData("a member's exchanged layout digest is not "
                                      "{variables, sha256}")
    return message


def detail(layout: list[Entry]) -> bytes:
    """What members exchange when digests differ: the layout as compressed JSON, cut to its
    longest head that fits DETAIL_BYTES."""
    low, high, best = 0, len(layout), b""
    while low <= high:  # the longest head that fits, by bisection
        middle = (low + high) // 2
        packed = zlib.compress(json.dumps(layout[:middle], separators=(",", ":")).encode(), 9)
        if len(packed) <= DETAIL_BYTES:
            best, low = packed, middle + 1
        else:
            high = middle - 1
    return plain_data.encode(best)


def _detail_message(blob: bytes) -> list[Entry]:
    packed = plain_data.decode(blob)
    if not isinstance(packed, bytes):
        raise plain_data.NotPlainData("a member's exchanged layout is not compressed bytes")
    expander = zlib.decompressobj()
    try:
        text = expander.decompress(packed, MAX_EXPANDED_BYTES)
        entries = json.loads(text)
    except (zlib.error, ValueError):
        raise plain_data.NotPlainData("a member's exchanged layout does not decompress to "
                                      "JSON") from None
    if expander.unconsumed_tail or not isinstance(entries, list) or not all(
            isinstance(e, list) and len(e) == 3 and isinstance(e[0], str)
            and isinstance(e[1], list) and isinstance(e[2], str)
            and all(n is None or type(n) is int for n in e[1]) for e in entries):
        raise plain_data.NotPlainData("a member's exchanged layout is not a list of "
                                      "(name, shape, dtype)")
    return [(name, tuple(shape), dtype) for name, shape, dtype in entries]
