"""KeepAlive: the heartbeats of a process's nodes on one stream, and the fallback to unary calls."""

from __future__ import annotations

import threading
import time

import pytest

from tensorflow_elastic.rendezvous import Client, keepalive
from tensorflow_elastic.rendezvous.errors import NodeRemovedError
from tensorflow_elastic.rendezvous.server import Orchestrator
from tensorflow_elastic.rendezvous.service import RendezvousService
from tensorflow_elastic.rendezvous.settings import RunSettings

# Sub-second heartbeat timeouts on real threads: no other test process beside it.
pytestmark = pytest.mark.serial

INTERVAL_S = 0.1


def _members(endpoint: str, count: int) -> list[Client]:
    clients = [Client(endpoint, "job") for _ in range(count)]
    threads = [threading.Thread(target=c.join, args=(f"127.0.0.1:{21500 + i}", count, count, 20))
               for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return clients


def _wait(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_nodes_of_a_process_share_one_stream_and_each_hears_its_own_answer():
    settings = RunSettings(heartbeat_timeout=1.0, last_call=0.1)
    with Orchestrator("127.0.0.1", 0, settings=settings) as server:
        clients = _members(server.endpoint, 3)
        replies = {c.node_id: [] for c in clients}
        stopped = {}
        for c in clients:
            c.start_heartbeats(INTERVAL_S, on_reply=replies[c.node_id].append,
                               on_stop=lambda e, n=c.node_id: stopped.setdefault(n, e))
        assert len({id(c._heartbeats._stream) for c in clients}) == 1
        _wait(lambda: all(len(r) >= 5 for r in replies.values()))
        assert all(r[-1].member and r[-1].generation == 1 for r in replies.values())
        assert all(c.heartbeat_error is None for c in clients)

        # One node goes silent: removed at the heartbeat timeout, the others beat on.
        quiet = clients[0]
        quiet.stop_heartbeats()
        _wait(lambda: any(r[-1].removed for r in replies.values() if r), timeout=5)
        [run] = clients[1].status()
        assert quiet.node_id not in run.membership.members
        assert sorted(n.node_id for n in run.nodes) == sorted(c.node_id for c in clients[1:])
        assert not stopped

        # Its beats resumed after the removal are refused: its heartbeats end, and say why.
        quiet.start_heartbeats(INTERVAL_S, on_stop=lambda e: stopped.setdefault("quiet", e))
        _wait(lambda: "quiet" in stopped)
        assert isinstance(stopped["quiet"], NodeRemovedError)
        assert "no heartbeat for 1 s" in str(stopped["quiet"])
        assert isinstance(quiet.heartbeat_error, NodeRemovedError)
        for c in clients:
            c.close()
        _wait(lambda: not keepalive.STREAMS._streams)


def test_an_orchestrator_without_keepalive_gets_unary_heartbeats(monkeypatch):
    method_handlers = RendezvousService.method_handlers

    def without_keepalive(self):
        served = method_handlers(self)
        del served["KeepAlive"]
        return served

    monkeypatch.setattr(RendezvousService, "method_handlers", without_keepalive)
    with Orchestrator("127.0.0.1", 0, settings=RunSettings(last_call=0.1)) as server:
        [client] = _members(server.endpoint, 1)
        replies = []
        client.start_heartbeats(INTERVAL_S, on_reply=replies.append)
        _wait(lambda: len(replies) >= 3)
        assert client._heartbeats._thread is not None  # the unary loop took over
        assert client.heartbeat_error is None
        client.close()


def test_one_message_renews_every_node_it_names():
    settings = RunSettings(heartbeat_timeout=0.6, last_call=0.1)
    with Orchestrator("127.0.0.1", 0, settings=settings) as server:
        clients = _members(server.endpoint, 3)
        for c in clients:
            c.start_heartbeats(INTERVAL_S)
        time.sleep(4 * settings.heartbeat_timeout)
        [run] = clients[0].status()
        assert run.membership.generation == 1
        assert all(n.silent_s < settings.heartbeat_timeout for n in run.nodes)
        for c in clients:
            c.close()
