"""A stale leader is fenced: watchers hear only of durable changes, a replica whose lease ran out
removes no one and sends nothing, and a graceful stop halts before the lease goes."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent import futures

import pytest

from tensorflow_elastic.observability import events
from tensorflow_elastic.observability.events import EventLog
from tensorflow_elastic.rendezvous import Client, etcd
from tensorflow_elastic.rendezvous.run import Run
from tensorflow_elastic.rendezvous.run_state import RunState
from tensorflow_elastic.rendezvous.server import Orchestrator
from tensorflow_elastic.rendezvous.service import RendezvousService
from tensorflow_elastic.rendezvous.settings import RunSettings
from tensorflow_elastic.rendezvous.store import MembershipStore
from tensorflow_elastic.rendezvous.types import JoinEntry
from tests.conftest import wait_until

# A real etcd and sub-second leases: no other test process beside it.
pytestmark = pytest.mark.serial


class _HeldStore(MembershipStore):
    """Saves only once the test releases them."""

    def __init__(self):
        self.release = threading.Event()

    def load(self):
        return {}

    def save(self, run_id, snapshot):
        self.release.wait(10)

    def delete(self, run_id):
        pass

    def set_aside(self, run_id, reason):
        pass


class _Observer:
    def membership_changed(self, *args):
        pass

    def rendezvous_done(self, *args):
        pass


def test_watchers_hear_of_a_generation_only_once_it_is_durable():
    async def scenario():
        settings = RunSettings(last_call=0)
        store = _HeldStore()
        run = Run(RunState.new("job", 1, 1, settings), settings, store, EventLog(None),
                  _Observer())
        run.start()
        updates = run.watch()
        assert (await anext(updates)).membership.generation == 0
        join = asyncio.create_task(run.join_many([JoinEntry("127.0.0.1:1", None, 0, "nonce",
                                                            timeout=10)]))
        await asyncio.sleep(0.2)
        assert run.generation == 1  # formed, not yet saved
        sent = asyncio.create_task(anext(updates))
        await asyncio.sleep(0.5)
        assert not sent.done(), "a generation went out before it was saved"
        store.release.set()
        assert (await asyncio.wait_for(sent, 5)).membership.generation == 1
        assert (await asyncio.wait_for(join, 5))[0].generation == 1
        await run.close()

    asyncio.run(scenario())


def _events(path, *kinds):
    if not path.exists():
        return []
    return [e for e in events.read_events(str(path)) if e["event"] in kinds]


def _replica(etcd_server, tmp_path, **settings) -> Orchestrator:
    server = Orchestrator("127.0.0.1", 0, store=etcd_server.url, leader_ttl=2,
                          events_file=str(tmp_path / "events.jsonl"),
                          settings=RunSettings(last_call=0, **settings)).start()
    wait_until(lambda: _events(tmp_path / "events.jsonl", events.LEADER_ELECTED), timeout=20,
               what="the replica to lead")
    return server


@pytest.mark.timeout(90)
def test_a_leader_whose_lease_ran_out_removes_no_one_and_sends_nothing(etcd_server, tmp_path,
                                                                       monkeypatch):
    """The replica's lease keep-alive blocks past the lease (a stalled etcd connection) while
    one member falls silent: whatever it decides then, the next leader would not know."""
    cut, release = threading.Event(), threading.Event()
    renew = etcd.EtcdClient.keep_alive

    def keep_alive(self, lease_id):
        if cut.is_set():
            release.wait(60)
            raise etcd.EtcdUnavailable("the test held the keep-alive")
        return renew(self, lease_id)

    monkeypatch.setattr(etcd.EtcdClient, "keep_alive", keep_alive)
    server = _replica(etcd_server, tmp_path, heartbeat_timeout=2.5)
    clients = [Client(server.endpoint, "job", retry_timeout=30) for _ in range(3)]
    watched = []
    try:
        a, b, watcher = clients
        with futures.ThreadPoolExecutor(2) as pool:
            joins = [pool.submit(c.join, f"127.0.0.1:{21100 + i}", 2, 2, 30)
                     for i, c in enumerate((a, b))]
            assert {j.result(60).generation for j in joins} == {1}
        for c in (a, b):
            c.start_heartbeats(0.2)

        def watch():
            try:
                for update in watcher.watch():
                    watched.append(update.membership.generation)
            except Exception:  # noqa: BLE001 - the client closed at the test's end
                pass

        threading.Thread(target=watch, daemon=True).start()
        wait_until(lambda: 1 in watched, timeout=20, what="the watcher to see generation 1")
        cut.set()
        b.stop_heartbeats()  # a member falls silent while the leader is cut off
        time.sleep(2 + 2.5 + 1.5)  # the lease and b's heartbeat timeout are long over
        removals = _events(tmp_path / "events.jsonl", events.NODE_LEFT,
                           events.FAILURE_DETECTED, events.GENERATION_START)
        assert [e["event"] for e in removals] == [events.GENERATION_START], removals
        assert set(watched) == {1}, f"sent by a replica that had lost its lease: {watched}"
    finally:
        release.set()
        for c in clients:
            c.close()
        server.stop()


def test_a_graceful_stop_halts_the_runs_before_the_lease_goes(etcd_server, tmp_path,
                                                              monkeypatch):
    order = []
    halt, revoke = RendezvousService.halt, etcd.EtcdClient.revoke
    monkeypatch.setattr(RendezvousService, "halt",
                        lambda self: (order.append("halt"), halt(self))[-1])
    monkeypatch.setattr(etcd.EtcdClient, "revoke",
                        lambda self, lease: (order.append("revoke"), revoke(self, lease))[-1])
    server = _replica(etcd_server, tmp_path)
    server.stop()
    assert order[:2] == ["halt", "revoke"], order
