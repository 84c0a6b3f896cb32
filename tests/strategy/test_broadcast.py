"""The state broadcast (collectives.VariableBroadcaster) among real TensorFlow processes."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tensorflow_elastic import net

pytestmark = pytest.mark.multiprocess

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


# A collective whose members disagree on what they exchange (see cluster.is_mismatch).
MISMATCH = ("InvalidArgumentError", "InternalError")
# What a re-form repairs (see cluster.is_recoverable).
RECOVERABLE = ("UnavailableError", "AbortedError", "CancelledError", "DeadlineExceededError")


def _initial(node_id):
    """The worker's initial values on `node_id` (the same generator as broadcast_worker.py)."""
    rng = np.random.RandomState(node_id)
    return [rng.randn(37, 5).astype(np.float32).tolist(), rng.randn(3).tolist(),
            rng.randint(0, 100, size=(2, 2, 2)).tolist(), (rng.rand(6) > 0.5).tolist(),
            float(node_id), [], rng.randn(2, 1000).astype(np.float16).tolist()]


def test_the_receivers_get_the_sources_values_and_a_receiver_that_differs_fails_alone(tmp_path):
    held = [net.hold_port("127.0.0.1") for _ in range(4)]
    members = {i: f"127.0.0.1:{s.getsockname()[1]}" for i, s in enumerate(held)}
    for s in held:
        s.close()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    # Files, not pipes: a worker blocked on a full pipe nobody reads yet would hold up the others.
    outs = [tmp_path / f"worker-{i}.out" for i in members]
    errs = [tmp_path / f"worker-{i}.err" for i in members]
    workers = [subprocess.Popen([sys.executable, os.path.join(HERE, "broadcast_worker.py"),
                                 str(i), json.dumps(members), str(tmp_path)], stdout=out.open("w"),
                                stderr=err.open("w"), env=env)
               for i, out, err in zip(members, outs, errs)]
    try:
        for w in workers:
            w.wait(timeout=120)
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait(timeout=30)
    outputs = [(out.read_text(), err.read_text()) for out, err in zip(outs, errs)]
    for w, (_, stderr) in zip(workers, outputs):
        assert w.returncode == 0, stderr[-3000:]
    records = [json.loads(line) for out, _ in outputs for line in out.splitlines()]
    lines = [r for r in records if r["generation"] < 5]
    by_generation = {g: [r for r in lines if r["generation"] == g] for g in (1, 2)}
    # Generation 1 from node 1, generation 2 from node 0: node 1's values stay everywhere.
    for generation in (1, 2):
        assert len(by_generation[generation]) == 4
        for record in by_generation[generation]:
            assert record["values"] == _initial(1), (generation, record["node"])
    # Generation 3, from node 2 to node 1 only: nodes 0 and 3 keep their own scalars.
    scalars = {r["node"]: r["values"][4] for r in lines if r["generation"] == 3}
    assert scalars == {0: 7.0, 1: 27.0, 2: 27.0, 3: 37.0}
    for record in lines:
        if record["generation"] == 3:
            assert record["values"][:4] == _initial(1)[:4]
    # Generation 4, from node 0 to each other member in turn.
    assert {r["node"]: r["values"][4] for r in lines
            if r["generation"] == 4} == {0: 7.0, 1: 7.0, 2: 7.0, 3: 7.0}
    # 64-byte chunks: the 37x5 float32 variable goes in 12 pieces, the empty one in none.
    assert lines[0]["chunks"] == [12, 1, 1, 1, 1, 0, 63]
    # Generation 5, node 0 to node 1 (whose first variable has another shape), then nodes 2 and
    # 3: only node 1 gets the mismatch (of shape, or of dtype when its chunks shift the instance
    # keys); the others' collectives end when they are aborted. (In one group of all four, node
    # 3 would take the state from node 1 in the broadcast's tree, and its mismatch with it.)
    errors = {r["node"]: r["error"] for r in records if r["generation"] == 5}
    assert errors[1] in MISMATCH, [r["message"] for r in records if r["generation"] == 5]
    assert all(errors[node] in RECOVERABLE for node in (0, 2, 3)), errors
