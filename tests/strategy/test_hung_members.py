"""Members that stop without dying, with real TensorFlow worker processes on 127.0.0.1: one that
hangs in Python while its heartbeat thread beats on, one frozen with SIGSTOP. The others go on
without it, and when it recovers it rejoins in its running process; every global batch is trained
on exactly once (the weights equal a one-process replay)."""

import signal
import time

import numpy as np
import pytest

from tensorflow_elastic.observability import events

from tests.strategy.replay import replay

pytestmark = pytest.mark.multiprocess

STEPS = 120
HEARTBEAT_TIMEOUT_S = 1.5


def _finish_together(workers):
    results = []
    for w in workers:
        assert w.wait() == 0, w.log_tail()
        assert w.result is not None, w.log_tail()
        results.append(w.result["weights"])
    assert all(r == results[0] for r in results), "members disagree on the final variables"
    np.testing.assert_allclose(results[0], replay(STEPS), rtol=1e-4, atol=1e-5)


def _three(start_orchestrator, start_workers, env=None):
    orchestrator = start_orchestrator(heartbeat_timeout=HEARTBEAT_TIMEOUT_S)
    workers = start_workers(orchestrator.endpoint, 3, min_nodes=2, max_nodes=3, steps=STEPS,
                            env=env)
    for w in workers:
        w.wait_for_step(10)
    return workers


def _highest(workers):
    return max(workers, key=lambda w: w.node_id)


def _wait_for_output(worker, text, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not any(text in line for line in worker.output):
        assert worker.proc.poll() is None and time.monotonic() < deadline, worker.log_tail()
        time.sleep(0.1)


def test_a_member_hung_in_python_steps_aside_and_comes_back(start_orchestrator, start_workers,
                                                            tmp_path):
    workers = _three(start_orchestrator, start_workers,
                     env={"HANG_FILE": str(tmp_path / "hang-{node}"), "TFE_PROGRESS_TIMEOUT": "2"})
    hung = _highest(workers)
    survivors = [w for w in workers if w is not hung]
    hang = tmp_path / f"hang-{hung.node_id}"
    hang.touch()
    # It steps aside; the others go on without it (heartbeat timeout, not the barrier's 30 s).
    for w in survivors:
        _wait_for_output(w, '"world": 2,')
    _wait_for_output(hung, "the main thread is not in TensorFlow")
    hang.unlink()
    _wait_for_output(hung, "and rejoined at generation")
    _finish_together(workers)
    assert hung.steps[-1]["world"] == 3
    stuck = [e for e in events.read_events(str(tmp_path / "events.jsonl"),
                                           events.FAILURE_DETECTED)
             if e.get("source") == "worker" and e["node"] == hung.node_id]
    assert stuck and stuck[0]["cause"].startswith("stuck: no commit for")


def test_a_member_frozen_past_the_heartbeat_timeout_rejoins_when_it_resumes(start_orchestrator,
                                                                            start_workers):
    workers = _three(start_orchestrator, start_workers)
    frozen = _highest(workers)
    survivors = [w for w in workers if w is not frozen]
    frozen.signal(signal.SIGSTOP)
    try:
        for w in survivors:
            _wait_for_output(w, '"world": 2,')
    finally:
        frozen.signal(signal.SIGCONT)
    _wait_for_output(frozen, "no heartbeat for 1.5 s) and rejoined at generation")
    _finish_together(workers)
    assert frozen.steps[-1]["world"] == 3
