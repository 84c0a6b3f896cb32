"""Persistence: kill -9 the orchestrator, restart it on the same port, the run goes on."""

from __future__ import annotations

import asyncio
import json
import queue
import threading

import pytest

from tensorflow_elastic.rendezvous.store import FileStore, GroupCommitter, MemoryStore


@pytest.mark.multiprocess
def test_kill_9_and_restart_keeps_the_run(start_orchestrator, nodes_for, wait, tmp_path):
    state_dir = str(tmp_path / "state")
    first = start_orchestrator("--state_dir", state_dir)
    nodes = nodes_for(first.endpoint)
    (a, ma), (b, _) = nodes.join(2, 2, 3)
    synced = [nodes.submit(c.synchronize, "addr", str(c.node_id).encode(), 30) for c in (a, b)]
    values = [f.result(timeout=30) for f in synced]
    [standby], [pending] = nodes.join_async(1, 2, 3, timeout=60)
    wait(lambda: a.heartbeat().waiting == 1, what="a waiting node")
    updates: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [updates.put(u) for u in b.watch()], daemon=True).start()
    assert updates.get(timeout=20).membership.generation == 1

    first.kill()  # SIGKILL: nothing is flushed at exit
    second = start_orchestrator("--state_dir", state_dir, port=first.port)

    # Members reconnect (the clients retry) with their ids and generation.
    info = a.heartbeat()
    assert (info.generation, info.member, info.waiting) == (1, True, 1)
    assert b.heartbeat().member
    # A completed exchange is still there for a member that retries it.
    assert a.synchronize("addr", b"retry", timeout=10) == values[0]
    # The standby's join was retried with its nonce: same node, still waiting; admit it.
    m2 = a.join(timeout=30)
    admitted = pending.result(timeout=30)
    assert admitted.generation == m2.generation == 2
    assert sorted(m2.members) == sorted([a.node_id, b.node_id, standby.node_id])
    # The watch broke with the orchestrator and subscribed again by itself.
    wait(lambda: updates.get(timeout=20).membership.generation == 2, what="watch of generation 2")
    # Ids are never reused across the restart.
    nodes.join_async(1, 2, 3, timeout=30)
    waiting = wait(lambda: [n for n in a.status()[0].nodes if n.role == "waiting"],
                   what="a new node waiting")
    assert waiting[0].node_id > max(m2.members)
    assert second.endpoint == first.endpoint


def test_file_store_round_trip(tmp_path):
    store = FileStore(str(tmp_path))
    store.save("job/1 ü", {"run_id": "job/1 ü", "generation": 3})
    store.save("other", {"run_id": "other", "generation": 1})
    store.save("other", {"run_id": "other", "generation": 2})
    assert FileStore(str(tmp_path)).load() == {"job/1 ü": {"run_id": "job/1 ü", "generation": 3},
                                               "other": {"run_id": "other", "generation": 2}}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    assert MemoryStore().load() == {}


def test_group_commit_batches_changes_made_during_a_save():
    class CountingStore(MemoryStore):
        persistent = True

        def __init__(self):
            self.saved = []

        def save(self, run_id, snapshot):
            self.saved.append(json.loads(json.dumps(snapshot)))

    async def scenario():
        store = CountingStore()
        state = {"n": 0}
        committer = GroupCommitter(store, "job", lambda: dict(state))
        tickets = []
        for _ in range(100):
            state["n"] += 1
            tickets.append(committer.mark())
        await asyncio.gather(*(committer.wait(t) for t in tickets))
        return store.saved

    saved = asyncio.run(scenario())
    assert saved[-1] == {"n": 100}
    assert len(saved) <= 2
