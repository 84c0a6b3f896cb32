"""Persistence: kill -9 the orchestrator, restart it on the same port, the run goes on."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest

from tensorflow_elastic.proto import rendezvous_pb2 as pb
from tensorflow_elastic.proto import rendezvous_pb2_grpc as pb_grpc
from tensorflow_elastic.rendezvous import Client
from tensorflow_elastic.rendezvous import store as store_module
from tensorflow_elastic.rendezvous.settings import heartbeat_interval
from tensorflow_elastic.rendezvous.store import (
    SAVE_SPACING_S, FileStore, GroupCommitter, MemoryStore, StoreInUse)

# Node addresses: nothing needs to listen there.
FIRST_NODE_PORT = 21000


@pytest.mark.multiprocess
def test_kill_9_and_restart_keeps_the_run(start_orchestrator, nodes_for, wait, tmp_path):
    state_dir = str(tmp_path / "state")
    first = start_orchestrator("--state_dir", state_dir)
    nodes = nodes_for(first.endpoint)
    (a, ma), (b, _) = nodes.join(2, 2, 3)
    synced = [nodes.submit(c.synchronize, "addr", str(c.node_id).encode(), 30) for c in (a, b)]
    values = [f.result(timeout=30) for f in synced]
    updates: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [updates.put(u) for u in b.watch()], daemon=True).start()
    assert updates.get(timeout=20).membership.generation == 1
    [standby], [pending] = nodes.join_async(1, 2, 3, timeout=60)
    # Watchers hear only of saved changes: once one hears of the waiting node, it is durable.
    wait(lambda: updates.get(timeout=20).waiting == 1, what="the waiting node, saved")

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
    store.save("other", {"run_id": "other", "generation": 1,
                         "node_changes": [[0, "a:1", "", 1], [1, "b:1", "n", 0]]})
    store.save("other", {"run_id": "other", "generation": 2, "node_changes": [[0]]})
    store.close()
    assert FileStore(str(tmp_path)).load() == {
        "job/1 ü": {"run_id": "job/1 ü", "generation": 3, "nodes": []},
        "other": {"run_id": "other", "generation": 2, "nodes": [[1, "b:1", "n", 0]]}}
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


def test_newcomers_saves_that_follow_each_other_start_a_spacing_apart():
    class PersistentStore(MemoryStore):
        persistent = True

    started = []

    def snapshot():  # taken on the loop as each save starts
        started.append(time.monotonic())
        return {}

    async def scenario():
        committer = GroupCommitter(PersistentStore(), "job", snapshot)
        end = time.monotonic() + 0.5
        while time.monotonic() < end:  # a change every millisecond, as a flood of joins
            committer.mark(urgent=False)
            await asyncio.sleep(0.001)
        await committer.wait(committer.last_ticket)

    asyncio.run(scenario())
    gaps = [b - a for a, b in zip(started[:-1], started[1:])]
    assert len(started) <= 0.5 / SAVE_SPACING_S + 3, len(started)
    assert min(gaps) >= SAVE_SPACING_S * 0.9, gaps


@pytest.mark.multiprocess
def test_an_id_handed_out_by_register_survives_kill_9_right_after_the_reply(
        start_orchestrator, tmp_path):
    state_dir = str(tmp_path / "state")
    server = start_orchestrator("--state_dir", state_dir)
    port = server.port
    for attempt in range(4):
        client = Client(server.endpoint, "job", retry_timeout=20.0)
        node_id = client.register(f"127.0.0.1:{FIRST_NODE_PORT + attempt}", 1, 8)
        server.kill()  # SIGKILL at once: only what was durable before the reply survives
        server = start_orchestrator("--state_dir", state_dir, port=port)
        assert client.heartbeat().generation == 0, f"node {node_id} after restart {attempt}"
        client.close()


@pytest.mark.multiprocess
def test_one_nonce_gets_one_node_however_many_joins_carry_it(start_orchestrator, tmp_path):
    # A state dir, so that a join awaits its save (the window the nonce must be reserved in).
    server = start_orchestrator("--state_dir", str(tmp_path / "state"))
    with grpc.insecure_channel(server.endpoint) as channel:
        stub = pb_grpc.RendezvousStub(channel)

        def register(nonce: str, port: int):
            return stub.Join.future(pb.JoinRequest(
                run_id="job", address=f"127.0.0.1:{port}", min_nodes=1, max_nodes=100,
                nonce=nonce, timeout_s=10, register_only=True), timeout=20)

        for trial in range(5):
            nonce = f"nonce-{trial}"
            calls = [register(nonce, FIRST_NODE_PORT + trial) for _ in range(3)]
            assert len({call.result().node_id for call in calls}) == 1, f"trial {trial}"
            # The nonce belongs to the address that sent it first.
            with pytest.raises(grpc.RpcError) as e:
                register(nonce, FIRST_NODE_PORT + 99).result()
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "nonce" in e.value.details()


@pytest.mark.multiprocess
def test_unreadable_state_files_are_set_aside_and_the_other_runs_served(
        start_orchestrator, nodes_for, tmp_path):
    state_dir = tmp_path / "state"
    first = start_orchestrator("--state_dir", str(state_dir))
    nodes_for(first.endpoint, run_id="good").join(1, 1, 1, heartbeat=None)
    nodes_for(first.endpoint, run_id="future").join(1, 1, 1, heartbeat=None)
    first.kill()
    files = {json.loads(p.read_bytes())["run_id"]: p for p in state_dir.glob("*.run.json")}
    future = json.loads(files["future"].read_bytes())
    files["future"].write_text(json.dumps(dict(future, format=99)))
    bad = {"truncated.run.json": files["good"].read_bytes()[:40],
           "random.run.json": bytes(range(256)) * 4,
           "empty.run.json": b"{}"}
    for name, data in bad.items():
        (state_dir / name).write_bytes(data)
    (state_dir / ".tmp-left-by-kill-9").write_bytes(b"half a snapshot")

    second = start_orchestrator("--state_dir", str(state_dir), port=first.port)

    assert [run.run_id for run in nodes_for(second.endpoint).client().status(all_runs=True)] == [
        "good"]
    for path in [state_dir / name for name in bad] + [files["future"]]:
        assert not path.exists() and path.with_name(path.name + ".corrupt").exists()
        assert len([line for line in second.output if path.name in line]) == 1, second.output
    assert (state_dir / "random.run.json.corrupt").read_bytes() == bad["random.run.json"]
    assert not list(state_dir.glob(".tmp-*"))


@pytest.mark.multiprocess
@pytest.mark.parametrize("run_id", ["r" * 128, "\N{GRINNING FACE}" * 31, "\N{GRINNING FACE}" * 128])
def test_run_ids_up_to_the_limit_are_stored(start_orchestrator, nodes_for, tmp_path, run_id):
    state_dir = str(tmp_path / "state")
    first = start_orchestrator("--state_dir", state_dir)
    [(_, m)] = nodes_for(first.endpoint, run_id=run_id).join(1, 1, 1, heartbeat=None)
    first.kill()
    second = start_orchestrator("--state_dir", state_dir, port=first.port)
    [run] = nodes_for(second.endpoint).client().status(all_runs=True)
    assert (run.run_id, run.membership.members) == (run_id, m.members)


def test_a_state_dir_of_the_former_naming_loads(tmp_path):
    # Before file names were hashed, a run's file was named after its id in hex.
    (tmp_path / ("job".encode().hex() + ".run.json")).write_text(
        json.dumps({"run_id": "job", "generation": 3}))
    store = FileStore(str(tmp_path))
    assert store.load() == {"job": {"run_id": "job", "generation": 3}}
    store.save("job", {"run_id": "job", "generation": 4})
    store.close()
    assert FileStore(str(tmp_path)).load() == {"job": {"run_id": "job", "generation": 4,
                                                       "nodes": []}}
    assert len([p for p in tmp_path.iterdir() if p.name.endswith(".run.json")]) == 1


def test_a_second_orchestrator_on_the_same_state_dir_is_refused_and_the_first_keeps_it(tmp_path):
    first = FileStore(str(tmp_path))
    first.save("job", {"run_id": "job", "generation": 1})
    with pytest.raises(StoreInUse, match=f"in use by another orchestrator \\(pid {os.getpid()}\\)"):
        FileStore(str(tmp_path))
    first.save("job", {"run_id": "job", "generation": 2})  # its files are untouched
    first.close()
    second = FileStore(str(tmp_path))  # free once the first let go
    assert second.load() == {"job": {"run_id": "job", "generation": 2, "nodes": []}}
    second.close()


def test_the_orchestrator_cli_refuses_a_state_dir_another_one_holds(tmp_path, subprocess_env):
    holder = FileStore(str(tmp_path))
    try:
        done = subprocess.run([sys.executable, "-m", "tensorflow_elastic.rendezvous", "--port",
                               "0", "--state_dir", str(tmp_path)], env=subprocess_env,
                              capture_output=True, text=True, timeout=60)
    finally:
        holder.close()
    assert done.returncode != 0
    assert "in use by another orchestrator" in done.stderr + done.stdout


@pytest.mark.multiprocess
@pytest.mark.parametrize("outage", ["sigstop", "kill_9_and_restart"])
def test_a_10_s_outage_of_the_orchestrator_removes_no_live_member(
        start_orchestrator, nodes_for, wait, tmp_path, outage):
    # The default timing: 1.5 s of silence removes a node, members beat every 0.25 s.
    state_dir = str(tmp_path / "state")
    server = start_orchestrator("--state_dir", state_dir, heartbeat_timeout=1.5)
    nodes = nodes_for(server.endpoint)
    joined = nodes.join(3, 3, 3, heartbeat=heartbeat_interval())
    watches = [threading.Thread(target=lambda c=c: [None for _ in c.watch()], daemon=True)
               for c, _ in joined]
    for thread in watches:
        thread.start()
    a = joined[0][0]
    wait(lambda: a.status()[0].membership.generation == 1, what="generation 1")
    if outage == "sigstop":  # a frozen orchestrator: its event loop resumes 10 s late
        os.kill(server.pid, signal.SIGSTOP)
        time.sleep(10.0)
        os.kill(server.pid, signal.SIGCONT)
    else:  # gone for 10 s, then back on the same state: the clients' channels back off
        server.kill()
        time.sleep(10.0)
        server = start_orchestrator("--state_dir", state_dir, port=server.port,
                                    heartbeat_timeout=1.5)
    time.sleep(6.0)  # past the grace a reloaded run gives its nodes, and several timeouts
    [run] = a.status()
    assert run.membership.generation == 1, run.history
    assert sorted(run.membership.members) == sorted(c.node_id for c, _ in joined)
    assert not [h for h in run.history if h["event"] in ("node_left", "failure_detected")], \
        run.history
    assert all(c.heartbeat_error is None for c, _ in joined)


def test_an_idle_store_and_a_change_members_wait_on_are_saved_without_the_spacing(monkeypatch):
    monkeypatch.setattr(store_module, "SAVE_SPACING_S", 60.0)  # far beyond the bounds below

    class PersistentStore(MemoryStore):
        persistent = True

    saves = []

    async def scenario():
        committer = GroupCommitter(PersistentStore(), "job", lambda: saves.append(1) or {})
        # An idle store saves at once: a wait of the spacing (60 s) would time out here.
        await asyncio.wait_for(committer.wait(committer.mark(urgent=False)), 30)
        queued = committer.mark(urgent=False)  # a newcomer right after: it waits the spacing
        await asyncio.sleep(0.5)
        held = len(saves)
        await asyncio.wait_for(committer.wait(committer.mark()), 30)  # a formation: at once
        await asyncio.wait_for(committer.wait(queued), 30)
        return held

    held = asyncio.run(scenario())
    assert held == 1  # the newcomer's save was held back...
    assert len(saves) == 2  # ...until the formation's, which carried it
