"""The member map in join replies and watch updates: encoded once per change and base.

When a generation forms, every member's join returns and every watcher gets an
update. Those that name the map they hold (see member_deltas.py) share one small
delta; the others share the whole map, encoded once. A reply is sent as bytes: a
protobuf message followed by another field is that message with the field merged
in, so a join reply is its node id's few bytes followed by the shared encoding.
A join that asks for no members (another node of its process fetches the map)
gets the map's name alone: generation, chief and digest. A client that asked for
packed maps gets many members packed (packed_maps.py), packed once per map and base.
"""

from __future__ import annotations

from tensorflow_elastic.proto import rendezvous_pb2 as pb
from tensorflow_elastic.rendezvous import packed_maps
from tensorflow_elastic.rendezvous.member_deltas import KEPT_MAPS, MapHistory, MapVersion
from tensorflow_elastic.rendezvous.types import Membership, MembershipUpdate

# Encodings one run keeps (per map and base): every client of a re-form shares the last two.
_KEPT_ENCODINGS = 16


def known_map(request: pb.JoinRequest | pb.WatchRequest) -> MapVersion | None:
    """The map a request names as the one its client holds (None: it names none)."""
    if not request.HasField("known_map"):
        return None
    return MapVersion(request.known_map.generation, request.known_map.digest)


class MapReplies:
    """One run's member maps as reply fields, for clients that hold a map or none."""

    def __init__(self) -> None:
        self._history = MapHistory()
        # id(members) -> (members, its version): the dicts are held, so their ids stay theirs.
        self._versions: dict[int, tuple[object, MapVersion]] = {}
        self._encoded: dict[tuple[str, MapVersion, MapVersion | None, bool], bytes] = {}
        # The members packed, by map and base: join replies and watch updates share them.
        self._packed: dict[tuple[MapVersion, MapVersion | None], bytes] = {}
        # The last update's other fields, encoded once for all its watchers.
        self._update_tail: tuple[MembershipUpdate | None, bytes] = (None, b"")

    def join_tail(self, membership: Membership, base: MapVersion | None,
                  omit_members: bool = False, packed: bool = False) -> bytes:
        """``membership`` as field 2 of a JoinResponse, a delta against ``base`` where it can;
        with ``omit_members``, the map's name without its members; with ``packed``, many
        members packed."""
        return self._encode("bare" if omit_members else "join", membership, base, packed)[0]

    def update(self, update: MembershipUpdate, base: MapVersion | None,
               packed: bool = False) -> tuple[bytes, MapVersion]:
        """``update`` as a MembershipUpdate, a delta against ``base`` where it can (with
        ``packed``, many members packed), and the version of its map (the base of the
        stream's next update)."""
        head, version = self._encode("update", update.membership, base, packed)
        if self._update_tail[0] is not update:
            self._update_tail = (update, pb.MembershipUpdate(
                state=pb.RunState.Value(update.state), waiting=update.waiting,
                reason=update.reason).SerializeToString())
        return head + self._update_tail[1], version

    def membership(self, membership: Membership) -> pb.Membership:
        """The whole map as a message (for Status)."""
        return self._message(membership, self._version(membership), None)

    def _version(self, membership: Membership) -> MapVersion:
        # By the dict's identity: joins are answered from the run's current map and watches
        # from its last durable one, alternately during a re-form; each is recorded once.
        members = membership.members
        known = self._versions.get(id(members))
        if known is not None and known[1].generation == membership.generation:
            return known[1]
        version = self._history.record(membership.generation, members)
        if len(self._versions) >= KEPT_MAPS:
            del self._versions[next(iter(self._versions))]
        self._versions[id(members)] = (members, version)
        return version

    def _encode(self, kind: str, membership: Membership, base: MapVersion | None,
                packed: bool) -> tuple[bytes, MapVersion]:
        version = self._version(membership)
        if kind == "bare" or base is not None and base not in self._history:
            base = None  # the whole map, encoded once for every client too far behind
        key = (kind, version, base, packed and kind != "bare")
        encoded = self._encoded.get(key)
        if encoded is None:
            message = self._message(membership, version, base, members=kind != "bare",
                                    packed=key[3])
            encoded = (pb.MembershipUpdate(membership=message) if kind == "update"
                       else pb.JoinResponse(membership=message)).SerializeToString()
            if len(self._encoded) >= _KEPT_ENCODINGS:
                self._encoded.clear()
                self._packed.clear()
            self._encoded[key] = encoded
        return encoded, version

    def _message(self, membership: Membership, version: MapVersion,
                 base: MapVersion | None, members: bool = True,
                 packed: bool = False) -> pb.Membership:
        message = pb.Membership(generation=membership.generation, chief_id=membership.chief_id,
                                digest=version.digest)
        if not members:
            return message
        delta = None if base is None else self._history.delta(base, version)
        added = membership.members if delta is None else delta.added
        if delta is not None:
            message.delta = True
            message.base.generation, message.base.digest = base.generation, base.digest
            message.removed.extend(delta.removed)
        if packed and packed_maps.worth_packing(added):
            pack = self._packed.get((version, base))
            if pack is None:
                pack = self._packed[version, base] = packed_maps.pack(added)
            message.packed_members = pack
        else:
            message.members.update(added)
        return message
