"""Joining, generations, standby nodes, re-forming, barriers and exchanges."""

from __future__ import annotations

import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tensorflow_elastic.rendezvous import (
    GenerationChangedError, InvalidArgumentError, RendezvousTimeoutError)

pytestmark = [pytest.mark.multiprocess, pytest.mark.light]


def test_bringup(orchestrator, nodes_for):
    with grpc.insecure_channel(orchestrator.endpoint) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="tensorflow_elastic.Rendezvous"), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    assert nodes_for(orchestrator.endpoint).client().status(all_runs=True) == []


def test_single_connect(orchestrator, nodes_for):
    [(client, m)] = nodes_for(orchestrator.endpoint).join(1, 1, 1)
    assert m.generation == 1
    assert m.members == {m.node_id: "127.0.0.1:20001"}
    assert m.chief_id == m.node_id and m.is_chief and m.rank == 0
    assert client.heartbeat().member


def test_multi_connect(orchestrator, nodes_for):
    joined = nodes_for(orchestrator.endpoint).join(3, 3, 3)
    memberships = [m for _, m in joined]
    ids = sorted(m.node_id for m in memberships)
    assert len(set(ids)) == 3
    for m in memberships:
        assert m.generation == 1
        assert sorted(m.members) == ids
        assert m.chief_id == ids[0]
    assert sorted(m.rank for m in memberships) == [0, 1, 2]


def test_waiting_workers(orchestrator, nodes_for, wait):
    nodes = nodes_for(orchestrator.endpoint)
    (member, m), _ = nodes.join(2, 2, 3)
    [standby], [pending] = nodes.join_async(1, 2, 3, timeout=30)
    wait(lambda: member.heartbeat().waiting == 1, what="one waiting node")
    assert not pending.done()
    info = member.heartbeat()
    assert (info.generation, info.member, info.queued, info.removed) == (1, True, 1, 0)
    assert info.change == 1
    # A standby whose join runs out of time learns why, and can keep waiting.
    late = nodes.client()
    with pytest.raises(RendezvousTimeoutError, match="waiting to be admitted"):
        late.join("127.0.0.1:29999", 2, 3, timeout=0.5)
    assert member.heartbeat().queued == 2


def test_reset_workers(orchestrator, nodes_for, wait):
    nodes = nodes_for(orchestrator.endpoint)
    (a, ma), (b, mb) = nodes.join(2, 2, 3)
    [c], [pending] = nodes.join_async(1, 2, 3)
    wait(lambda: a.heartbeat().waiting == 1, what="one waiting node")
    # A member re-joining its generation ends it: the next one admits the waiting node.
    m2 = a.join(timeout=30)
    assert m2.generation == 2
    assert len(m2.members) == 3
    mc = pending.result(timeout=30)
    assert mc.generation == 2 and mc.members == m2.members
    assert b.heartbeat().removed == 0 and b.heartbeat().generation == 2
    mb2 = b.join(timeout=30)
    assert (mb2.node_id, mb2.generation, mb2.members) == (b.node_id, 2, m2.members)
    futures = [nodes.submit(cl.barrier, "start", 30) for cl in (a, b, c)]
    for f in futures:
        f.result(timeout=40)


def test_synchronize(orchestrator, nodes_for):
    nodes = nodes_for(orchestrator.endpoint)
    joined = nodes.join(3, 3, 3)
    futures = [nodes.submit(c.synchronize, "addr", f"port-{c.node_id}".encode(), 30)
               for c, _ in joined]
    results = [f.result(timeout=40) for f in futures]
    expected = {c.node_id: f"port-{c.node_id}".encode() for c, _ in joined}
    assert all(r == expected for r in results)
    # The same key again (a retry) returns the same values at once.
    assert joined[0][0].synchronize("addr", b"ignored", timeout=5) == expected


def test_synchronize_fail(orchestrator, nodes_for):
    nodes = nodes_for(orchestrator.endpoint)
    (a, _), (b, _) = nodes.join(2, 2, 2)
    with pytest.raises(InvalidArgumentError, match="exceeds the 65536-byte limit"):
        a.synchronize("big", b"x" * (64 * 1024 + 1), timeout=5)
    # A member that never arrives is removed (it may be hung), and the generation ends.
    with pytest.raises(GenerationChangedError):
        a.synchronize("ready", b"1", timeout=0.5)
    left = [h for h in a.status()[0].history if h["event"] == "node_left"]
    assert left[0]["nodes"] == [b.node_id] and "did not reach" in left[0]["detail"]


def test_barrier(orchestrator, nodes_for):
    nodes = nodes_for(orchestrator.endpoint)
    joined = nodes.join(4, 4, 4)
    futures = [nodes.submit(c.barrier, "go", 30) for c, _ in joined]
    for f in futures:
        assert f.result(timeout=40) is None


def test_barrier_fail(orchestrator, nodes_for):
    nodes = nodes_for(orchestrator.endpoint)
    (a, _), (b, _), (c, _) = nodes.join(3, 2, 3)
    # A generation that ends under a waiting barrier fails it at once.
    pending = nodes.submit(a.barrier, "again", 30)
    c.leave("preempted")
    with pytest.raises(GenerationChangedError, match="join again"):
        pending.result(timeout=30)
    a.join(timeout=10)
    # The members that never arrive are removed (they may be hung): the generation ends.
    with pytest.raises(GenerationChangedError):
        a.barrier("go", timeout=0.5)
    left = [h for h in a.status()[0].history if h["event"] == "node_left"]
    assert left[-1]["nodes"] == [b.node_id]
    assert "did not reach barrier 'go' of generation 2" in left[-1]["detail"]


def test_status_command(orchestrator, nodes_for, subprocess_env):
    nodes_for(orchestrator.endpoint).join(2, 2, 2)
    out = subprocess.run([sys.executable, "-m", "tensorflow_elastic.cli", "status",
                          "--rdzv_endpoint", orchestrator.endpoint],
                         capture_output=True, text=True, timeout=60, env=subprocess_env)
    assert out.returncode == 0, out.stderr
    assert "run job: ACTIVE, generation 1, 2 member(s) (min 2, max 2)" in out.stdout
    assert "generation_start" in out.stdout

