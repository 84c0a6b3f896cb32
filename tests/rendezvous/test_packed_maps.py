"""Member maps packed (compressed once per map) for clients that read them; whole `members`
for those that do not ask, and small maps unpacked."""

from __future__ import annotations

import zlib

import grpc
import pytest

from tensorflow_elastic.proto import rendezvous_pb2 as pb
from tensorflow_elastic.proto import rendezvous_pb2_grpc as pb_grpc
from tensorflow_elastic.rendezvous import (Client, Membership, RendezvousError, member_deltas,
                                           packed_maps)
from tensorflow_elastic.rendezvous.client import read_membership
from tensorflow_elastic.rendezvous.map_replies import MapReplies
from tensorflow_elastic.rendezvous.member_deltas import MapVersion
from tensorflow_elastic.rendezvous.server import Orchestrator
from tensorflow_elastic.rendezvous.settings import RunSettings

_NODES = packed_maps.PACK_FROM_MEMBERS + 6


def _entry(i: int, nodes: int = _NODES, **fields) -> pb.JoinRequest:
    return pb.JoinRequest(run_id="job", address=f"10.0.{i // 256}.{i % 256}:2222",
                          min_nodes=nodes, max_nodes=nodes, nonce=f"n{i}", timeout_s=20,
                          **fields)


def _count_packs(monkeypatch) -> list[int]:
    """The size of every map the orchestrator packs, from now on."""
    packs = []
    pack = packed_maps.pack

    def counted(members):
        packs.append(len(members))
        return pack(members)

    monkeypatch.setattr(packed_maps, "pack", counted)
    return packs


def test_a_large_map_goes_packed_once_to_the_clients_that_read_packed_maps(monkeypatch):
    packs = _count_packs(monkeypatch)
    with Orchestrator("127.0.0.1", 0, settings=RunSettings(heartbeat_timeout=5.0)) as server:
        stub = pb_grpc.RendezvousStub(grpc.insecure_channel(server.endpoint))
        reply = stub.JoinMany(pb.JoinManyRequest(joins=[
            _entry(i, packed_maps=True, omit_members=i % 2 == 1) for i in range(_NODES)]),
            timeout=30)
        answers = [answer.reply for answer in reply.answers]
        whole = answers[0].membership
        assert not whole.members and whole.packed_members
        members = packed_maps.members_of(whole)
        assert members == {a.node_id: f"10.0.{i // 256}.{i % 256}:2222"
                           for i, a in enumerate(answers)}
        assert whole.digest == member_deltas.digest(members)
        assert len(whole.packed_members) < pb.Membership(members=members).ByteSize() / 2
        # Watches that ask share the same pack; one that does not gets `members`, as before.
        packed = next(stub.Watch(pb.WatchRequest(run_id="job", packed_maps=True), timeout=20))
        plain = next(stub.Watch(pb.WatchRequest(run_id="job"), timeout=20))
        assert packed.membership.packed_members == whole.packed_members
        assert not packed.membership.members
        assert dict(plain.membership.members) == members and not plain.membership.packed_members
        assert packs == [_NODES]


def test_a_small_map_goes_unpacked_even_to_a_client_that_reads_packed_maps():
    with Orchestrator("127.0.0.1", 0, settings=RunSettings(heartbeat_timeout=5.0)) as server:
        stub = pb_grpc.RendezvousStub(grpc.insecure_channel(server.endpoint))
        reply = stub.JoinMany(pb.JoinManyRequest(joins=[
            _entry(i, nodes=3, packed_maps=True) for i in range(3)]), timeout=30)
        membership = reply.answers[0].reply.membership
        assert len(membership.members) == 3 and not membership.packed_members


def test_a_client_reads_a_packed_map_from_its_join_and_its_watch(monkeypatch):
    packs = _count_packs(monkeypatch)
    with Orchestrator("127.0.0.1", 0, settings=RunSettings(heartbeat_timeout=5.0)) as server:
        stub = pb_grpc.RendezvousStub(grpc.insecure_channel(server.endpoint))
        others = stub.JoinMany.future(pb.JoinManyRequest(joins=[
            _entry(i, omit_members=True) for i in range(1, _NODES)]), timeout=30)
        with Client(server.endpoint, "job") as client:
            membership = client.join(_entry(0).address, _NODES, _NODES, timeout=20)
            ids = [answer.reply.node_id for answer in others.result().answers]
            assert sorted(membership.members) == sorted([client.node_id, *ids])
            assert membership.members[client.node_id] == _entry(0).address
            assert client._held[1] == membership.members
            update = next(client.watch())
            assert update.membership.members == membership.members
        assert packs == [_NODES]  # the client asked for packed maps, and read them


def test_a_packed_map_that_cannot_be_read_is_a_clear_error():
    whole = packed_maps.pack({node: f"10.0.0.{node}:2222" for node in range(100)})
    for damaged in (b"not zlib", zlib.compress(b"\xff\xff\xff"), whole + b"\x00",
                    *(whole[:cut] for cut in range(len(whole) // 2, len(whole)))):
        with pytest.raises(RendezvousError, match="packed member map could not be read"):
            packed_maps.members_of(pb.Membership(packed_members=damaged))


def test_a_large_delta_goes_packed_and_applies_onto_the_map_named():
    replies = MapReplies()
    old = {i: f"10.0.0.{i}:2222" for i in range(3)}
    new = {**{i: a for i, a in old.items() if i != 1},
           **{i: f"10.0.1.{i}:2222" for i in range(10, 10 + _NODES)}}
    base = MapVersion(1, member_deltas.digest(old))
    replies.join_tail(Membership(None, 1, old, 0), None)  # the map the client was sent
    sent = pb.JoinResponse.FromString(
        replies.join_tail(Membership(None, 2, new, 0), base, packed=True)).membership
    assert sent.delta and not sent.members and sent.packed_members
    assert list(sent.removed) == [1]
    client = read_membership(None, sent, (base, old))[0]
    assert client.members == new
