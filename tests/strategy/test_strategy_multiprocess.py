"""ElasticMultiWorkerMirroredStrategy with real TensorFlow processes on 127.0.0.1.

Each scenario kills, stops or adds real worker processes and checks that the
survivors go on in-process (no restart), hold identical variables, keep the
loss falling, and record what happened in the events file.
"""

import signal

import pytest

from tensorflow_elastic import events

pytestmark = pytest.mark.multiprocess

STEPS = 60


def _read(tmp_path, event):
    return list(events.read_events(str(tmp_path / "events.jsonl"), event=event))


def _check_finished_together(workers, steps=STEPS):
    results = []
    for w in workers:
        assert w.wait() == 0, w.log_tail()
        assert w.result is not None, w.log_tail()
        results.append(w.result["weights"])
        assert w.steps[-1]["step"] == steps
    assert all(r == results[0] for r in results), "members disagree on the final variables"
    for w in workers:
        losses = [r["loss"] for r in w.steps]
        assert losses[-1] < losses[0] / 100, losses


def _node(workers, node_id):
    return next(w for w in workers if w.node_id == node_id)


@pytest.mark.parametrize("victim", ["member", "chief"])
def test_survivors_reform_in_process_after_a_kill(orchestrator, start_workers, tmp_path, victim):
    workers = start_workers(orchestrator.endpoint, 3, min_nodes=2, max_nodes=3, steps=STEPS)
    for w in workers:
        w.wait_for_step(10)
    chief = min(w.node_id for w in workers)
    target = _node(workers, chief) if victim == "chief" else _node(workers, max(w.node_id for w in workers))
    pids = {w.node_id: w.proc.pid for w in workers}
    target.signal(signal.SIGKILL)
    survivors = [w for w in workers if w is not target]
    _check_finished_together(survivors)
    for w in survivors:
        assert w.proc.pid == pids[w.node_id]  # the same processes, never restarted
        assert w.steps[-1]["world"] == 2
    starts = _read(tmp_path, events.GENERATION_START)
    assert {e["node"] for e in starts} == {w.node_id for w in survivors}
    assert all(target.node_id not in e["members"] for e in starts)
    assert all(e["chief"] == min(w.node_id for w in survivors) for e in starts)
    assert _read(tmp_path, events.FAILURE_DETECTED)
    restored = _read(tmp_path, events.STATE_RESTORED)
    assert {e["node"] for e in restored} == {w.node_id for w in survivors}


def test_sigterm_leaves_at_a_step_boundary_without_rollback(orchestrator, start_workers, tmp_path):
    workers = start_workers(orchestrator.endpoint, 3, min_nodes=2, max_nodes=3, steps=STEPS)
    for w in workers:
        w.wait_for_step(10)
    leaver = _node(workers, max(w.node_id for w in workers))
    leaver.signal(signal.SIGTERM)
    assert leaver.wait() == 0, leaver.log_tail()
    survivors = [w for w in workers if w is not leaver]
    _check_finished_together(survivors)
    assert _read(tmp_path, events.STATE_RESTORED) == []
    left = _read(tmp_path, events.NODE_LEFT)
    assert [e["node"] for e in left if e.get("source") == "worker"] == [leaver.node_id]
    for w in survivors:
        steps = [r["step"] for r in w.steps]
        assert steps == sorted(set(steps)), "a step was redone: the leave rolled back work"
