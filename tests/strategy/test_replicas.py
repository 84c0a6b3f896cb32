"""Three orchestrator replicas on a real etcd, real training workers, the leader killed -9.

Training goes on through a failover: no id is handed out twice, no live member is
dropped, the survivors agree on the weights, and the events record the failover.
"""

from __future__ import annotations

import signal

import pytest

from tensorflow_elastic.observability import events

pytestmark = pytest.mark.multiprocess

STEPS = 100
LEADS = "leads now"


@pytest.fixture
def replicas(etcd_server, start_orchestrator, tmp_path):
    """Three replicas sharing one etcd and the test's events file; the first one leads."""
    flags = ("--store", etcd_server.url, "--leader_ttl", "1",
             "--events_file", str(tmp_path / "events.jsonl"))
    started = [start_orchestrator(*flags)]
    _wait_leading(started[0])
    started += [start_orchestrator(*flags) for _ in range(2)]
    return started


def _wait_leading(replica, timeout: float = 30.0) -> None:
    replica.wait_for_line("this replica", timeout=timeout)


def _endpoints(replicas) -> str:
    return ",".join(r.endpoint for r in replicas)


def _read(tmp_path, event):
    return list(events.read_events(str(tmp_path / "events.jsonl"), event=event))


def _leader(tmp_path, replicas):
    elected = [e["replica"] for e in _read(tmp_path, events.LEADER_ELECTED)
               + _read(tmp_path, events.ORCHESTRATOR_FAILOVER)]
    return next(r for r in replicas if r.endpoint == elected[-1])


def _check_finished(workers, steps=STEPS):
    for w in workers:
        assert w.wait() == 0, w.log_tail()
        assert w.result is not None and w.steps[-1]["step"] == steps, w.log_tail()
    assert len({tuple(w.result["weights"]) for w in workers}) == 1, "members disagree"


def _check_failover(tmp_path, killed, members_lost=()):
    failovers = _read(tmp_path, events.ORCHESTRATOR_FAILOVER)
    assert failovers and failovers[-1]["previous"] == killed.endpoint
    # A node is recorded when it registers and again when it queues: same id, same address.
    joined = {(e["node"], e["address"]) for e in _read(tmp_path, events.NODE_JOINED)}
    ids = [node for node, _ in joined]
    assert len(ids) == len(set(ids)), f"an id was handed out twice: {sorted(joined)}"
    lost = {n for e in _read(tmp_path, events.FAILURE_DETECTED) for n in e.get("failed", [])}
    assert lost == set(members_lost), f"live members were dropped: {lost}"


def test_leader_killed_during_steady_training(replicas, start_workers, tmp_path):
    workers = start_workers(_endpoints(replicas), 3, min_nodes=2, max_nodes=3, steps=STEPS)
    for w in workers:
        w.wait_for_step(10)
    leader = _leader(tmp_path, replicas)
    leader.kill(signal.SIGKILL)
    _check_finished(workers)
    assert all(w.steps[-1]["world"] == 3 for w in workers)
    _check_failover(tmp_path, leader)


def test_leader_killed_during_a_reform(replicas, start_workers, tmp_path):
    workers = start_workers(_endpoints(replicas), 3, min_nodes=2, max_nodes=3, steps=STEPS)
    for w in workers:
        w.wait_for_step(10)
    victim = max(workers, key=lambda w: w.node_id)
    leader = _leader(tmp_path, replicas)
    victim.signal(signal.SIGKILL)
    leader.kill(signal.SIGKILL)
    survivors = [w for w in workers if w is not victim]
    _check_finished(survivors)
    assert all(w.steps[-1]["world"] == 2 for w in survivors)
    _check_failover(tmp_path, leader, members_lost=[victim.node_id])


def test_leader_killed_during_a_newcomers_join(replicas, start_workers, tmp_path, wait):
    # Steps enough for a newcomer that takes seconds to import TensorFlow on a loaded machine
    # to join before the members finish (it registered 1.5 s before their end once in CI).
    steps = 3 * STEPS
    first = start_workers(_endpoints(replicas), 2, min_nodes=2, max_nodes=3, steps=steps)
    for w in first:
        w.wait_for_step(10)
    newcomer = start_workers(_endpoints(replicas), 1, min_nodes=2, max_nodes=3, steps=steps)[0]
    wait(lambda: len(_read(tmp_path, events.NODE_JOINED)) == 3, timeout=60,
         what="the newcomer to register")
    leader = _leader(tmp_path, replicas)
    leader.kill(signal.SIGKILL)
    _check_finished(first + [newcomer], steps)
    assert newcomer.steps[0]["world"] == 3
    _check_failover(tmp_path, leader)


def test_etcd_restarted_the_replicas_wait_and_resume(replicas, etcd_server, start_workers,
                                                      tmp_path, wait):
    workers = start_workers(_endpoints(replicas), 3, min_nodes=2, max_nodes=3, steps=STEPS)
    for w in workers:
        w.wait_for_step(10)
    etcd_server.kill()
    # The leader steps down before its lease could end; nobody can lead until etcd is back.
    wait(lambda: _read(tmp_path, events.LEADER_LOST), timeout=30, what="the leader to step down")
    etcd_server.start()
    _check_finished(workers)
    assert all(w.steps[-1]["world"] == 3 for w in workers)
    # Neither the replica that lost the lead (whose shutdown broke every watch stream) nor
    # the new leader took a live member for a dead one.
    assert _read(tmp_path, events.FAILURE_DETECTED) == []
    elected = _read(tmp_path, events.LEADER_ELECTED) + _read(tmp_path, events.ORCHESTRATOR_FAILOVER)
    assert len(elected) >= 2 and elected[-1]["runs"] == 1  # the new term loaded the run
