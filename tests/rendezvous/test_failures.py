"""Failure handling: heartbeat timeouts, reports, leaves, standby admission, the run failing."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import grpc
import pytest

from tensorflow_elastic.observability.events import read_events
from tensorflow_elastic.proto import rendezvous_pb2 as pb
from tensorflow_elastic.proto import rendezvous_pb2_grpc as pb_grpc
from tensorflow_elastic.rendezvous import (BlocklistedError, NodeRemovedError, RendezvousError,
                                           RunFailedError)
from tensorflow_elastic.rendezvous.blocklist import Blocklist
from tensorflow_elastic.rendezvous.liveness import FIRST_BEAT_MAX_S

pytestmark = [pytest.mark.multiprocess, pytest.mark.light]


@pytest.mark.serial  # the live nodes' beats must keep arriving within a 1 s timeout
def test_heartbeat_timeout_removes_node_and_bumps_generation(start_orchestrator, nodes_for, wait,
                                                            tmp_path):
    events_file = tmp_path / "events.jsonl"
    server = start_orchestrator("--events_file", str(events_file), heartbeat_timeout=1.0)
    (a, _), (b, _), (c, _) = nodes_for(server.endpoint).join(3, 2, 3)
    c.heartbeat()  # it has beaten: silent from here on
    c.stop_heartbeats()
    info = wait(lambda: (i := a.heartbeat()).generation == 2 and i, what="generation 2")
    assert info.removed == 1 and info.member  # a is in generation 2 but must re-join to learn it
    m = a.join(timeout=10)
    assert sorted(m.members) == sorted([a.node_id, b.node_id])
    with pytest.raises(NodeRemovedError, match=f"node {c.node_id} was removed"):
        c.heartbeat()
    failures = list(read_events(str(events_file), "failure_detected"))
    assert failures[0]["failed"] == [c.node_id] and "no heartbeat" in failures[0]["cause"]
    starts = [e["members"] for e in read_events(str(events_file), "generation_start")]
    assert starts == [sorted([a.node_id, b.node_id, c.node_id]), sorted([a.node_id, b.node_id])]
    assert [e["node"] for e in read_events(str(events_file), "node_left")] == [c.node_id]


def test_chief_removed_next_lowest_becomes_chief(orchestrator, nodes_for):
    joined = sorted(nodes_for(orchestrator.endpoint).join(3, 2, 3), key=lambda j: j[1].node_id)
    (chief, m), (second, _), (third, _) = joined
    assert m.chief_id == chief.node_id
    chief.leave("preempted")
    m2 = second.join(timeout=10)
    assert m2.generation == 2
    assert m2.chief_id == second.node_id and m2.is_chief
    assert third.join(timeout=10).chief_id == second.node_id


def test_unique_ids_under_50_concurrent_joins(orchestrator, nodes_for):
    joined = nodes_for(orchestrator.endpoint).join(50, 50, 50, heartbeat=None)
    ids = [m.node_id for _, m in joined]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 50
    assert all(m.members == joined[0][1].members and m.generation == 1 for _, m in joined)


def test_max_nodes_standby_admitted_when_member_leaves(orchestrator, nodes_for, wait):
    nodes = nodes_for(orchestrator.endpoint)
    (a, m), (b, _) = nodes.join(2, 1, 2)
    [standby], [pending] = nodes.join_async(1, 1, 2)
    wait(lambda: a.heartbeat().queued == 1, what="a queued node")
    assert a.heartbeat().waiting == 0  # the generation is full: re-forming would not help
    assert not pending.done()
    b.leave("preempted")
    admitted = pending.result(timeout=30)
    assert admitted.generation == 2
    assert sorted(admitted.members) == sorted([a.node_id, standby.node_id])


@pytest.mark.serial  # the live nodes' beats must keep arriving within a 1 s timeout
def test_below_min_timeout_fails_the_run_for_every_member(start_orchestrator, nodes_for, wait):
    server = start_orchestrator("--below_min_timeout", "1", heartbeat_timeout=1.0)
    nodes = nodes_for(server.endpoint)
    (a, _), (b, _), (c, _) = nodes.join(3, 3, 3)
    updates = []
    watcher = threading.Thread(target=lambda: updates.extend(b.watch()), daemon=True)
    watcher.start()
    c.heartbeat()  # it has beaten: silent from here on
    c.stop_heartbeats()
    wait(lambda: a.heartbeat().state == "FORMING", what="the run falling below min_nodes")
    rejoin = nodes.submit(lambda: a.join(timeout=30))  # a survivor waits for nodes to come back
    with pytest.raises(RunFailedError, match="not enough nodes came back within 1 s"):
        rejoin.result(timeout=30)
    with pytest.raises(RunFailedError, match="restart the job"):
        b.heartbeat()
    watcher.join(timeout=30)
    assert updates[-1].state == "FAILED" and "min_nodes=3" in updates[-1].reason


def test_report_failure_reforms_at_once(orchestrator, nodes_for):
    (a, _), (b, _), (c, _) = nodes_for(orchestrator.endpoint).join(3, 2, 3)
    # Nothing listens at c's address, so the orchestrator's probe confirms the report.
    confirmed, alive = a.report_failure([c.node_id], "collective timed out")
    assert (confirmed, alive) == ([c.node_id], [])
    assert b.heartbeat().generation == 2
    assert c.node_id not in a.join(timeout=10).members


def test_report_from_an_ended_generation_removes_a_dead_member_at_once(orchestrator, nodes_for):
    (a, _), (b, _), (c, _) = nodes_for(orchestrator.endpoint).join(3, 2, 3)
    # a re-joins (the members ended generation 1 at a commit): generation 2 forms
    # with all three while b, still re-forming, speaks from generation 1.
    assert a.join(timeout=10).generation == 2
    assert b.generation == 1
    # Nothing listens at c's address, so the orchestrator's probe confirms b's late report.
    assert b.report_failure([c.node_id], "collective failed") == ([c.node_id], [])
    assert a.heartbeat().generation == 3
    assert c.node_id not in a.join(timeout=10).members
    # Reported again once gone: nothing left to check or remove.
    assert b.report_failure([c.node_id], "collective failed") == ([], [])
    assert a.heartbeat().generation == 3


def test_report_failure_of_live_peer_is_rejected(orchestrator, nodes_for):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        nodes = nodes_for(orchestrator.endpoint)
        a, live = nodes.client(), nodes.client()
        futures = [nodes.submit(a.join, "127.0.0.1:20900", 2, 2, 30),
                   nodes.submit(live.join, address, 2, 2, 30)]
        for f in futures:
            f.result(timeout=30)
        a.start_heartbeats(0.3)
        live.start_heartbeats(0.3)
        confirmed, alive = a.report_failure([live.node_id], "flaky link")
        assert (confirmed, alive) == ([], [live.node_id])
        assert a.heartbeat().generation == 1


def test_two_live_members_that_report_each_other_lose_the_higher_id_once(orchestrator,
                                                                         nodes_for):
    nodes = nodes_for(orchestrator.endpoint)
    joined = sorted(nodes.join(3, 2, 3), key=lambda joined: joined[0].node_id)
    (chief, membership), (low, _), (high, _) = joined
    listeners = [socket.socket() for _ in range(3)]
    with listeners[0], listeners[1], listeners[2]:
        # Every node's address answers the orchestrator's probes: all are alive.
        for listener, address in zip(listeners, membership.members.values()):
            host, port = address.rsplit(":", 1)
            listener.bind((host, int(port)))
            listener.listen()
        # One side's report alone removes nobody: its reporter may be the one in trouble.
        assert low.report_failure([high.node_id], "PeerUnreachable") == ([], [high.node_id])
        assert chief.heartbeat().generation == 1
        assert high.report_failure([low.node_id], "PeerUnreachable") == ([], [low.node_id])
        with pytest.raises(NodeRemovedError, match="partition"):
            high.heartbeat()
        members = chief.join(timeout=10).members
        assert high.node_id not in members and low.node_id in members
        [run] = chief.status()
        assert [address for address, _, _ in run.blocklist] == [membership.members[high.node_id]]


def test_repeated_failures_blocklist_the_address(start_orchestrator, nodes_for, wait):
    server = start_orchestrator("--blocklist_after", "2", "--blocklist_cooldown", "600")
    nodes = nodes_for(server.endpoint)
    [(a, _)] = nodes.join(1, 1, 2)
    flaky = "127.0.0.1:20777"
    for _ in range(2):
        node = nodes.client()
        joining = nodes.submit(node.join, flaky, 1, 2, 30)
        wait(lambda: a.heartbeat().waiting == 1, what="the flaky node waiting")
        a.join(timeout=10)  # re-form to admit the flaky node
        joining.result(timeout=30)
        assert a.report_failure([node.node_id], "unreachable")[0] == [node.node_id]
        a.join(timeout=10)  # catch up with the generation that lost it
    with pytest.raises(BlocklistedError, match=f"{flaky} failed 2 times and is blocked"):
        nodes.client().join(flaky, 1, 2, timeout=5)
    [run] = a.status()
    assert [(addr, failures) for addr, failures, _ in run.blocklist] == [(flaky, 2)]


def test_blocklist_cooldown_doubles():
    blocklist = Blocklist(after=2, cooldown=10.0, max_cooldown=35.0)
    assert blocklist.record_failure("h:1", now=0.0) == 0.0
    blocklist.check("h:1", now=0.0)
    assert [blocklist.record_failure("h:1", now=0.0) for _ in range(3)] == [10.0, 20.0, 35.0]
    with pytest.raises(BlocklistedError):
        blocklist.check("h:1", now=34.0)
    blocklist.check("h:1", now=35.5)
    restored = Blocklist(after=2, cooldown=10.0, max_cooldown=35.0)
    restored.restore(blocklist.snapshot())
    assert restored.blocked(now=1.0) == [("h:1", 4, 34.0)]


def test_leave_is_recorded_and_idempotent(start_orchestrator, nodes_for, tmp_path):
    events_file = tmp_path / "events.jsonl"
    server = start_orchestrator("--events_file", str(events_file))
    (a, _), (b, _) = nodes_for(server.endpoint).join(2, 1, 2)
    b.leave("preempted")
    b.leave("again")  # a retried leave is harmless
    [left] = list(read_events(str(events_file), "node_left"))
    assert left["node"] == b.node_id and "preempted" in left["reason"]
    assert not list(read_events(str(events_file), "failure_detected"))


@pytest.mark.serial  # the live nodes' beats must keep arriving within a 1.5 s timeout
def test_a_failing_heartbeat_listener_does_not_stop_the_heartbeats(start_orchestrator,
                                                                   nodes_for):
    server = start_orchestrator(heartbeat_timeout=1.5)
    nodes = nodes_for(server.endpoint)
    [(a, _)] = nodes.join(1, 1, 1, heartbeat=None)
    replies = []

    def broken_listener(info):
        replies.append(info)
        raise RuntimeError("listener bug")

    a.start_heartbeats(0.2, broken_listener)
    time.sleep(3 * 1.5)
    assert len(replies) > 10
    assert a.heartbeat_error is None
    [run] = a.status()
    assert [n.node_id for n in run.nodes if n.role == "member"] == [a.node_id]


# A node in its own process: joins, heartbeats, watches; killed by the test.
_WATCHING_NODE = """
import sys
from tensorflow_elastic.rendezvous import Client
client = Client(sys.argv[1], "job")
client.join("127.0.0.1:20950", 2, 3, timeout=30)
client.start_heartbeats(0.3)
for update in client.watch():
    print(update.membership.generation, flush=True)
"""


@pytest.mark.serial  # the watch's loss is judged against a 1 s grace
def test_a_killed_member_whose_watch_broke_is_removed_before_its_heartbeat_timeout(
        start_orchestrator, nodes_for, subprocess_env, wait, tmp_path):
    events_file = tmp_path / "events.jsonl"
    # The generation forms when all three have joined (max_nodes), never without the process.
    server = start_orchestrator("--events_file", str(events_file), "--watch_loss_grace", "1",
                                heartbeat_timeout=120, last_call=120)
    members, joining = nodes_for(server.endpoint).join_async(2, 2, 3)
    node = subprocess.Popen([sys.executable, "-c", _WATCHING_NODE, server.endpoint],
                            stdout=subprocess.PIPE, text=True, env=subprocess_env)
    try:
        for future in joining:
            future.result(timeout=60)
        member = members[0]
        assert node.stdout.readline().strip() == "1"  # it watches generation 1
        node.kill()
        node.wait(timeout=30)
        wait(lambda: member.heartbeat().generation == 2, timeout=30,
             what="the killed node's removal")
    finally:
        node.kill()
        node.wait(timeout=30)
    [failure] = read_events(str(events_file), "failure_detected")
    assert "connection closed" in failure["cause"], failure


def test_a_newcomer_whose_watch_broke_before_its_first_beat_is_removed_after_the_grace(
        start_orchestrator, nodes_for, wait, tmp_path):
    # Its join reply keeps it alive until its first beat (FIRST_BEAT_MAX_S); that hold is no
    # message from it, so its broken watch still counts.
    events_file = tmp_path / "events.jsonl"
    server = start_orchestrator("--events_file", str(events_file), "--watch_loss_grace", "0.5",
                                heartbeat_timeout=120, last_call=120)
    nodes = nodes_for(server.endpoint)
    [a], [a_joined] = nodes.join_async(1, 1, 2)
    [b], [b_joined] = nodes.join_async(1, 1, 2, heartbeat=None)
    a_joined.result(timeout=60)
    b_joined.result(timeout=60)
    stream = pb_grpc.RendezvousStub(grpc.insecure_channel(server.endpoint)).Watch(
        pb.WatchRequest(run_id="job", node_id=b.node_id))
    assert next(stream).membership.generation == 1
    stream.cancel()
    wait(lambda: a.heartbeat().generation == 2, timeout=FIRST_BEAT_MAX_S - 2,
         what="the silent newcomer's removal before its first beat was due")
    [failure] = read_events(str(events_file), "failure_detected")
    assert failure["failed"] == [b.node_id] and "connection closed" in failure["cause"], failure


@pytest.mark.serial  # its beats must keep arriving within a 0.5 s grace
def test_a_live_member_whose_watch_broke_stays(start_orchestrator, nodes_for):
    server = start_orchestrator("--watch_loss_grace", "0.5", heartbeat_timeout=120)
    [(a, _), (b, _)] = nodes_for(server.endpoint).join(2, 2, 2, heartbeat=0.1)
    stream = pb_grpc.RendezvousStub(grpc.insecure_channel(server.endpoint)).Watch(
        pb.WatchRequest(run_id="job", node_id=b.node_id))
    assert next(stream).membership.generation == 1
    stream.cancel()
    time.sleep(2.0)
    assert a.heartbeat().generation == 1
    assert b.heartbeat().member


def test_a_member_its_agent_reports_dead_is_removed_at_once_without_a_probe(orchestrator,
                                                                           nodes_for):
    nodes = nodes_for(orchestrator.endpoint)
    (a, m), (b, _) = sorted(nodes.join(2, 1, 2), key=lambda j: j[1].node_id)
    # b's process died; its port may already be someone else's, so nobody probes it.
    nodes.client().report_death(b.node_id, "killed by SIGKILL")
    m2 = a.join(timeout=10)
    assert m2.generation == m.generation + 1 and sorted(m2.members) == [a.node_id]
    [run] = a.status()
    assert any("its process died: killed by SIGKILL" in h["detail"] for h in run.history)
    nodes.client().report_death(b.node_id, "killed by SIGKILL")  # a repeat changes nothing
    assert a.heartbeat().generation == m2.generation


def test_a_registered_standby_its_agent_reports_dead_does_not_linger(orchestrator, nodes_for):
    nodes = nodes_for(orchestrator.endpoint)
    [(member, _)] = nodes.join(1, 1, 2)
    standby = nodes.client()
    standby.register("127.0.0.1:20002", 1, 2)
    nodes.client().report_death(standby.node_id, "exit code 1")
    [run] = member.status()
    assert standby.node_id not in [n.node_id for n in run.nodes]


def test_a_node_that_names_itself_among_other_peers_is_refused(orchestrator, nodes_for):
    (a, _), (b, _) = nodes_for(orchestrator.endpoint).join(2, 2, 2)
    with pytest.raises(RendezvousError, match="report its death alone"):
        a.report_failure([a.node_id, b.node_id])
