"""Elastic input end to end: real workers grow and lose members, faults land on faults.

Over the committed steps every element id is consumed exactly once, each
global batch is the contiguous run a single process would read, and the final
weights equal those of one process applying the same global batches.
"""

import json
import signal
import time

import numpy as np
import pytest

from tensorflow_elastic.observability import events

pytestmark = pytest.mark.multiprocess

ELEMENTS = 600
GLOBAL_BATCH = 6
STEPS = ELEMENTS // GLOBAL_BATCH
# 0.25 s per step until the newcomer is in: its start-up has about 20 s before the job ends.
ARGS = [str(ELEMENTS), str(GLOBAL_BATCH), "0.05", "0.25"]


def _reference_weights():
    """One process, float64, the same global batches in the same order."""
    true = np.array([0.5, -1.0, 2.0, 0.25])
    w = np.zeros(4)
    for step in range(STEPS):
        i = np.arange(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH, dtype=np.float64)
        x = np.stack([np.sin(i), np.cos(i), np.mod(i, 7.0) / 7.0, np.ones_like(i)], axis=1)
        grad = 2 * x.T @ (x @ w - x @ true) / GLOBAL_BATCH
        w = w - 0.1 * grad
    return w


def test_exactly_once_and_equivalent_across_grow_and_kill(orchestrator, start_workers):
    first = start_workers(orchestrator.endpoint, 2, min_nodes=2, max_nodes=3,
                          script="data/elastic_input_worker.py", args=ARGS)
    for w in first:
        w.wait_for_step(10)
    newcomer = start_workers(orchestrator.endpoint, 1, min_nodes=2, max_nodes=3,
                             script="data/elastic_input_worker.py", args=ARGS)[0]
    newcomer.wait_for_step(1)
    victim = min(first, key=lambda w: w.node_id)  # the chief
    victim.wait_for_step(newcomer.steps[0]["step"] + 5)
    victim.signal(signal.SIGKILL)
    survivors = [w for w in first if w is not victim] + [newcomer]
    records = _check_exactly_once_and_replay(first + [newcomer], survivors)
    assert {r["generation"] for r in records} >= {1, 2, 3}


def _check_exactly_once_and_replay(workers, survivors):
    """Every survivor finishes; every id once over the committed steps; weights as replayed."""
    for w in survivors:
        assert w.wait() == 0, w.log_tail()
    records = [r for w in workers for r in w.steps]
    consumed = []
    for step in range(1, STEPS + 1):
        runs = [r for r in records if r["step"] == step]
        latest = max(r["generation"] for r in runs)
        batch = sorted(i for r in runs if r["generation"] == latest for i in r["ids"])
        assert batch == list(range((step - 1) * GLOBAL_BATCH, step * GLOBAL_BATCH)), step
        consumed += batch
    assert sorted(consumed) == list(range(ELEMENTS))

    finals = [np.array(w.result["weights"]) for w in survivors]
    for weights in finals:
        np.testing.assert_array_equal(weights, finals[0])
    np.testing.assert_allclose(finals[0], _reference_weights(), rtol=1e-5)
    return records


def _orchestrator_events(tmp_path, event):
    path = tmp_path / "events.jsonl"
    if not path.exists():
        return []
    return [e for e in map(json.loads, path.read_text().splitlines())
            if e["event"] == event and e.get("source") == "orchestrator"]


def test_the_chief_killed_while_newcomers_join_then_a_member_during_their_sync(
        start_orchestrator, start_workers, tmp_path, wait):
    orchestrator = start_orchestrator("--events_file", str(tmp_path / "events.jsonl"))
    first = start_workers(orchestrator.endpoint, 3, min_nodes=2, max_nodes=5,
                          script="data/elastic_input_worker.py", args=ARGS)
    for w in first:
        w.wait_for_step(3)
    old = sorted(w.node_id for w in first)
    newcomers = start_workers(orchestrator.endpoint, 2, min_nodes=2, max_nodes=5,
                              script="data/elastic_input_worker.py", args=ARGS)

    def asks_to_join():
        # A standby's second node_joined: it registered, built its model, and now asks.
        joined = [e["node"] for e in _orchestrator_events(tmp_path, events.NODE_JOINED)
                  if e["node"] not in old]
        return any(joined.count(node) >= 2 for node in joined)

    wait(asks_to_join, timeout=120, interval=0.005, what="a newcomer asking to join")
    chief = min(first, key=lambda w: w.node_id)
    chief.signal(signal.SIGKILL)

    def admitted():
        return [e for e in _orchestrator_events(tmp_path, events.GENERATION_START)
                if set(e["members"]) - set(old)]

    wait(admitted, timeout=120, interval=0.005, what="a generation with a newcomer")
    # Its members sync the state to the newcomer now.
    second = max(first, key=lambda w: w.node_id)
    second.signal(signal.SIGKILL)
    survivors = [w for w in first if w not in (chief, second)] + newcomers
    _check_exactly_once_and_replay(first + newcomers, survivors)
    assert all(w.steps for w in newcomers), "a newcomer never trained"


def test_the_orchestrator_restarted_during_a_re_form(start_orchestrator, start_workers, tmp_path):
    """A member dies and the orchestrator is SIGKILLed at once; restarted on its port from its
    --state_dir, it finishes the re-form."""
    state_dir = str(tmp_path / "state")
    server = start_orchestrator("--state_dir", state_dir)
    workers = start_workers(server.endpoint, 3, min_nodes=2, max_nodes=3,
                            script="data/elastic_input_worker.py", args=ARGS)
    for w in workers:
        w.wait_for_step(10)
    victim = max(workers, key=lambda w: w.node_id)
    victim.signal(signal.SIGKILL)
    server.kill()
    time.sleep(0.5)  # the survivors find it gone in the middle of their re-form
    start_orchestrator("--state_dir", state_dir, port=server.port)
    survivors = [w for w in workers if w is not victim]
    _check_exactly_once_and_replay(workers, survivors)
    assert all(w.steps[-1]["generation"] > victim.steps[-1]["generation"] for w in survivors)
