"""Members that stop answering without dying: removed by the heartbeat timeout or by a barrier
they never reach, the others go on; a removed node whose process lived on comes back with its id,
like a newcomer. An in-process orchestrator with light clients (no TensorFlow)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tensorflow_elastic.rendezvous import Client, Orchestrator
from tensorflow_elastic.rendezvous.errors import (BlocklistedError, GenerationChangedError,
                                                  NodeRemovedError)
from tensorflow_elastic.rendezvous.settings import RunSettings
from tensorflow_elastic.rendezvous.types import Phase

HEARTBEAT_S = 0.1


@pytest.fixture
def server():
    with Orchestrator("127.0.0.1", 0, settings=RunSettings(heartbeat_timeout=1.0,
                                                           last_call=0.2)) as orchestrator:
        yield orchestrator


@pytest.fixture
def pool():
    with ThreadPoolExecutor(8) as executor:
        yield executor


def _join(server, pool, count: int, max_nodes: int = 3) -> list[Client]:
    clients = [Client(server.endpoint, "job", retry_timeout=10) for _ in range(count)]
    futures = [pool.submit(c.join, f"127.0.0.1:{21000 + i}", 2, max_nodes, 20)
               for i, c in enumerate(clients)]
    for c, f in zip(clients, futures):
        f.result(timeout=30)
        c.start_heartbeats(HEARTBEAT_S)
    return clients


def _wait_for(condition, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return value


def test_a_silent_member_removed_by_the_heartbeat_timeout_comes_back_with_its_id(server, pool):
    a, b, c = _join(server, pool, 3)
    try:
        c.heartbeat()  # it has beaten: silent from here on
        c.stop_heartbeats()  # silent, not dead: a cut-off host, a frozen process
        _wait_for(lambda: a.heartbeat().generation == 2)
        with pytest.raises(NodeRemovedError) as removed:
            c.heartbeat()
        assert removed.value.may_return and "no heartbeat for 1 s" in removed.value.message
        for x in (a, b):
            assert x.join(timeout=10).generation == 2
        back = pool.submit(c.join, timeout=20)  # with its id: waits to be admitted
        _wait_for(lambda: a.heartbeat().waiting == 1)
        members = [f.result(timeout=30) for f in
                   [pool.submit(a.join, timeout=20), pool.submit(b.join, timeout=20), back]]
        assert {m.generation for m in members} == {3}
        assert sorted(members[0].members) == sorted([a.node_id, b.node_id, c.node_id])
        assert [m.taken_back_after for m in members] == [
            "", "", f"node {c.node_id} was removed from run 'job' (no heartbeat for 1 s)"]
        history = [h["detail"] for h in a.status()[0].history]
        assert any("came back after it was removed (no heartbeat for 1 s)" in h for h in history)
    finally:
        for client in (a, b, c):
            client.close()


def test_a_node_reported_dead_by_its_agent_cannot_come_back_with_its_id(server, pool):
    a, b, c = _join(server, pool, 3)
    try:
        c.heartbeat()  # it has beaten: silent from here on
        c.stop_heartbeats()
        a.report_death(c.node_id, "exit code -9")  # its port may already be its replacement's
        with pytest.raises(NodeRemovedError) as removed:
            c.join(timeout=5)
        assert not removed.value.may_return and "join without a node id" in removed.value.message
    finally:
        for client in (a, b, c):
            client.close()


def test_a_member_that_never_reaches_a_barrier_is_removed_and_the_others_re_form(server, pool):
    a, b, c = _join(server, pool, 3)
    try:
        # c heartbeats on but hangs before the barrier: its heartbeat thread is fine.
        waits = [pool.submit(x.barrier, "sync", 1.0) for x in (a, b)]
        for w in waits:
            with pytest.raises(GenerationChangedError):
                w.result(timeout=20)
        members = [f.result(timeout=30) for f in
                   [pool.submit(a.join, timeout=20), pool.submit(b.join, timeout=20)]]
        assert sorted(members[0].members) == sorted([a.node_id, b.node_id])
        status = a.status()[0]
        assert status.state == Phase.ACTIVE
        assert any("did not reach barrier 'sync' of generation 1 within" in h["detail"]
                   for h in status.history)
        _wait_for(lambda: isinstance(c.heartbeat_error, NodeRemovedError))
        assert c.heartbeat_error.may_return  # the hung member may come back once it recovers
    finally:
        for client in (a, b, c):
            client.close()


def test_a_node_whose_address_is_blocklisted_may_not_come_back_yet(pool):
    settings = RunSettings(heartbeat_timeout=1.0, last_call=0.2, blocklist_after=1)
    with Orchestrator("127.0.0.1", 0, settings=settings) as server:
        a, b, c = _join(server, pool, 3)
        try:
            c.heartbeat()  # it has beaten: silent from here on
            c.stop_heartbeats()
            _wait_for(lambda: a.heartbeat().generation == 2)
            with pytest.raises(BlocklistedError, match="127.0.0.1:21002"):
                c.join(timeout=5)
        finally:
            for client in (a, b, c):
                client.close()
