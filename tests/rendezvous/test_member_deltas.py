"""Member maps as deltas: the digest, the orchestrator's history, the client's check, and the
protocol (joins and watches that name a map get what changed; others the whole map)."""

from __future__ import annotations

import random
import threading

import grpc
import pytest

from tensorflow_elastic.proto import rendezvous_pb2 as pb
from tensorflow_elastic.proto import rendezvous_pb2_grpc as pb_grpc
from tensorflow_elastic.rendezvous import Client, member_deltas
from tensorflow_elastic.rendezvous.client import read_membership
from tensorflow_elastic.rendezvous.member_deltas import (
    Delta, DeltaMismatch, MapHistory, MapVersion, apply, diff, digest, digest_after)
from tensorflow_elastic.rendezvous.server import Orchestrator
from tensorflow_elastic.rendezvous.settings import RunSettings
from tests.conftest import wait_until


def _map(ids, port: int = 2222) -> dict[int, str]:
    return {i: f"10.0.{i // 256}.{i % 256}:{port}" for i in ids}


def test_the_digest_follows_what_changed_and_ignores_order():
    old = _map(range(50))
    new = {**_map(range(10, 60)), 12: "10.9.9.9:1"}
    delta = diff(old, new)
    assert sorted(delta.removed) == list(range(10))
    assert set(delta.added) == set(range(50, 60)) | {12}
    assert digest_after(digest(old), old, delta) == digest(new)
    assert digest(dict(reversed(list(new.items())))) == digest(new)
    assert apply(old, digest(old), delta, digest(new)) == new
    assert digest({}) == 0


def test_the_history_gives_deltas_from_the_maps_it_kept_only():
    history = MapHistory(kept=3)
    maps = [_map(range(g, g + 20)) for g in range(5)]
    versions = [history.record(g + 1, m) for g, m in enumerate(maps)]
    assert [v.digest for v in versions] == [digest(m) for m in maps]
    assert history.record(5, dict(maps[4])) == versions[4]  # the same map again: one version
    assert history.delta(versions[0], versions[4]) is None  # no longer kept
    delta = history.delta(versions[2], versions[4])
    assert apply(maps[2], versions[2].digest, delta, versions[4].digest) == maps[4]
    assert history.delta(MapVersion(4, 12345), versions[4]) is None  # never sent
    # An empty map in the same generation (fell below min_nodes) is another version.
    empty = history.record(5, {})
    assert empty == MapVersion(5, 0) and empty != versions[4]


def test_bad_deltas_never_apply_silently():
    rng = random.Random(38)
    for _ in range(300):
        old = _map(rng.sample(range(500), rng.randint(0, 40)))
        new = _map(rng.sample(range(500), rng.randint(0, 40)), port=rng.choice([2222, 2223]))
        delta = diff(old, new)
        assert apply(old, digest(old), delta, digest(new)) == new
        bad = _corrupt(rng, old, delta)
        try:
            result = apply(old, digest(old), bad, digest(new))
        except DeltaMismatch:
            continue
        assert result == new, (old, delta, bad)  # a corruption that changed nothing


def _corrupt(rng: random.Random, old: dict[int, str], delta: Delta) -> Delta:
    added, removed = dict(delta.added), list(delta.removed)
    kind = rng.randrange(5)
    if kind == 0 and removed:
        removed.pop(rng.randrange(len(removed)))
    elif kind == 1:
        removed.append(rng.randrange(1000, 2000))  # an id the map never held
    elif kind == 2 and added:
        node_id = rng.choice(list(added))
        added[node_id] = added[node_id] + "0"
    elif kind == 3:
        added[rng.randrange(1000, 2000)] = "10.1.1.1:1"
    elif old:
        node_id = rng.choice(list(old))  # removed and added at once
        removed.append(node_id)
        added[node_id] = old[node_id]
    return Delta(added, removed)


def test_a_client_asks_for_the_whole_map_when_a_delta_does_not_check_out():
    held = (MapVersion(1, digest(_map(range(3)))), _map(range(3)))
    whole = pb.Membership(generation=2, members=_map(range(4)), chief_id=0,
                          digest=digest(_map(range(4))))
    membership, now = read_membership(7, whole, None)
    assert membership.members == _map(range(4)) and now[0] == MapVersion(2, whole.digest)
    delta = pb.Membership(generation=2, members={3: _map([3])[3]}, chief_id=0,
                          digest=whole.digest, delta=True,
                          base=pb.KnownMap(generation=1, digest=held[0].digest))
    assert read_membership(7, delta, held)[0].members == _map(range(4))
    with pytest.raises(DeltaMismatch):
        read_membership(7, delta, None)  # a delta to a request that named no map
    with pytest.raises(DeltaMismatch):
        read_membership(7, delta, (MapVersion(1, 99), _map(range(3))))  # another base
    delta.digest ^= 1
    with pytest.raises(DeltaMismatch):
        read_membership(7, delta, held)


def _next_generation(stream, generation: int) -> pb.MembershipUpdate:
    for update in stream:
        if update.membership.generation == generation:
            return update
        assert update.membership.delta or len(update.membership.members) == 20
    raise AssertionError("the stream ended")


def _size(message) -> int:
    return len(message.SerializeToString())


def test_joins_and_watches_that_name_their_map_get_deltas_and_others_the_whole_map():
    settings = RunSettings(heartbeat_timeout=5.0, last_call=0.1)
    with Orchestrator("127.0.0.1", 0, settings=settings) as server:
        clients = [Client(server.endpoint, "job") for _ in range(20)]
        threads = [threading.Thread(target=c.join, args=(f"127.0.0.1:{22000 + i}", 20, 21, 20))
                   for i, c in enumerate(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stub = pb_grpc.RendezvousStub(grpc.insecure_channel(server.endpoint))
        first = clients[0]
        version, members = first._held
        assert members == clients[5]._held[1] and len(members) == 20

        # An old client (names no map): the whole map, in joins and watches alike.
        plain = stub.Watch(pb.WatchRequest(run_id="job"), timeout=20)
        update = next(plain)
        assert not update.membership.delta and dict(update.membership.members) == members
        known = pb.KnownMap(generation=version.generation, digest=version.digest)
        named = stub.Watch(pb.WatchRequest(run_id="job", known_map=known), timeout=20)
        update = next(named)
        assert update.membership.delta and not update.membership.members
        assert not update.membership.removed and update.membership.digest == version.digest

        # A newcomer waits; a member re-joins: the next generation admits it.
        newcomer = Client(server.endpoint, "job")
        joined = threading.Thread(target=newcomer.join, args=("127.0.0.1:22100", 20, 21, 20))
        joined.start()
        watched = []

        def watch() -> None:
            for update in clients[1].watch():
                watched.append(update)
                if update.membership.generation == 2:
                    return

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        wait_until(lambda: any(n.role == "waiting" for n in first.status()[0].nodes),
                   what="the newcomer waiting")
        m2 = first.join()
        joined.join()
        watcher.join(timeout=20)
        assert m2.generation == 2 and len(m2.members) == 21
        assert m2.members == newcomer._held[1]
        assert [u.membership.members for u in watched][-1] == m2.members

        update = _next_generation(named, 2)  # deltas against the stream's last update
        assert update.membership.delta and list(update.membership.members) == [newcomer.node_id]
        assert _size(update) < 100
        update = _next_generation(plain, 2)
        assert not update.membership.delta and len(update.membership.members) == 21

        # A join naming a map the orchestrator never sent gets the whole map.
        reply = stub.Join(pb.JoinRequest(
            run_id="job", address="127.0.0.1:22001", min_nodes=20, max_nodes=21,
            node_id=clients[1].node_id, last_generation=1, nonce="x", timeout_s=10,
            known_map=pb.KnownMap(generation=1, digest=12345)), timeout=20)
        assert not reply.membership.delta and len(reply.membership.members) == 21
        reply = stub.Join(pb.JoinRequest(
            run_id="job", address="127.0.0.1:22001", min_nodes=20, max_nodes=21,
            node_id=clients[1].node_id, last_generation=1, nonce="y", timeout_s=10,
            known_map=known), timeout=20)
        assert reply.membership.delta and list(reply.membership.members) == [newcomer.node_id]

        # A client whose map went bad where the delta touches it gets the whole map again.
        stale = clients[2]
        stale._held = (stale._held[0], {**stale._held[1], newcomer.node_id: "10.0.0.1:1"})
        m = stale.join()
        assert m.generation == 2 and m.members == m2.members
        assert stale._held[0].digest == member_deltas.digest(m.members)
        for c in [*clients, newcomer]:
            c.close()
