"""Member maps sent as what changed since the map the client holds.

A member map of 10,000 nodes is ~240 KB: sent whole in every join reply and
watch update of a re-form it is 2.4 GB. A client names the map it holds (its
generation and digest); the orchestrator answers with the members added and
the ids removed since, while it still holds that map (the last few it sent),
and with the whole map otherwise. The digest is a sum of the entries' hashes,
so both sides update it with what changed alone; a client that applied a delta
checks it against the orchestrator's and asks for the whole map on a mismatch.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
from typing import Mapping

# Maps the orchestrator keeps per run to compute deltas from: a client further behind (or new)
# gets the whole map.
KEPT_MAPS = 8
_MASK = (1 << 64) - 1


@dataclasses.dataclass(frozen=True)
class MapVersion:
    """Names a member map: its generation (several maps may share one, e.g. the empty map of
    a run that fell below min_nodes) and its digest."""

    generation: int
    digest: int


@dataclasses.dataclass(frozen=True)
class Delta:
    """What changed: members added (or whose address changed), then ids removed."""

    added: dict[int, str]
    removed: list[int]


class DeltaMismatch(ValueError):
    """A delta does not apply to the map the client holds: ask for the whole map."""


def entry_hash(node_id: int, address: str) -> int:
    """A stable 64-bit hash of one member (the same in every process, unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(f"{node_id}\0{address}".encode(),
                                          digest_size=8).digest(), "little")


def digest(members: Mapping[int, str]) -> int:
    """The digest of a whole map: the sum of its entries' hashes, modulo 2**64."""
    return sum(entry_hash(node_id, address) for node_id, address in members.items()) & _MASK


def diff(old: Mapping[int, str], new: Mapping[int, str]) -> Delta:
    return Delta({node_id: address for node_id, address in new.items()
                  if old.get(node_id) != address},
                 [node_id for node_id in old if node_id not in new])


def digest_after(old_digest: int, old: Mapping[int, str], delta: Delta) -> int:
    """The digest of ``old`` with ``delta`` applied, from the entries that changed alone."""
    value = old_digest
    for node_id in delta.removed:
        value -= entry_hash(node_id, old[node_id])
    for node_id, address in delta.added.items():
        if node_id in old:
            value -= entry_hash(node_id, old[node_id])
        value += entry_hash(node_id, address)
    return value & _MASK


def apply(old: Mapping[int, str], old_digest: int, delta: Delta,
          expected_digest: int) -> dict[int, str]:
    """``old`` with ``delta`` applied, as a new map; DeltaMismatch when the result's digest is
    not ``expected_digest`` or the delta removes an id ``old`` does not hold."""
    if any(node_id not in old or node_id in delta.added for node_id in delta.removed):
        raise DeltaMismatch(f"the delta removes ids the map does not hold: {delta.removed[:5]}")
    value = digest_after(old_digest, old, delta)
    if value != expected_digest:
        raise DeltaMismatch(f"digest {value:#x} after the delta, the orchestrator's is "
                            f"{expected_digest:#x}")
    new = dict(old)
    for node_id in delta.removed:
        del new[node_id]
    new.update(delta.added)
    return new


class MapHistory:
    """The last member maps a run sent, by version: a client naming one of them gets a delta.

    Maps are kept by reference (a run replaces its member map, never changes it in place),
    so keeping a few costs their dicts, not copies of the addresses.
    """

    def __init__(self, kept: int = KEPT_MAPS):
        self._kept = kept
        self._maps: collections.OrderedDict[MapVersion, Mapping[int, str]] = (
            collections.OrderedDict())

    def record(self, generation: int, members: Mapping[int, str]) -> MapVersion:
        """The version of ``members``, kept from now on; its digest is computed from the last
        recorded map and what changed since (the whole map only the first time)."""
        if self._maps:
            latest, latest_members = next(reversed(self._maps.items()))
            if latest.generation == generation and latest_members == members:
                return latest
            version = MapVersion(generation, digest_after(
                latest.digest, latest_members, diff(latest_members, members)))
        else:
            version = MapVersion(generation, digest(members))
        self._maps.pop(version, None)
        self._maps[version] = members
        while len(self._maps) > self._kept:
            self._maps.popitem(last=False)
        return version

    def __contains__(self, version: MapVersion) -> bool:
        return version in self._maps

    def delta(self, base: MapVersion, to: MapVersion) -> Delta | None:
        """What changed from ``base`` to ``to`` (a recorded version); None when ``base`` is not
        kept (the client is too far behind, or names a map this orchestrator never sent)."""
        old = self._maps.get(base)
        return None if old is None else diff(old, self._maps[to])
