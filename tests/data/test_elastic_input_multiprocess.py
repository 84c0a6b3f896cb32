"""Elastic input end to end: real workers grow 2 -> 3, one is SIGKILLed, 3 -> 2.

Over the committed steps every element id is consumed exactly once, each
global batch is the contiguous run a single process would read, and the final
weights equal those of one process applying the same global batches.
"""

import signal

import numpy as np
import pytest

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
    for w in survivors:
        assert w.wait() == 0, w.log_tail()

    records = [r for w in first + [newcomer] for r in w.steps]
    assert {r["generation"] for r in records} >= {1, 2, 3}
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
