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


def _initial(node_id):
    """The worker's initial values on `node_id` (the same generator as broadcast_worker.py)."""
    rng = np.random.RandomState(node_id)
    return [rng.randn(37, 5).astype(np.float32).tolist(), rng.randn(3).tolist(),
            rng.randint(0, 100, size=(2, 2, 2)).tolist(), (rng.rand(6) > 0.5).tolist(),
            float(node_id), [], rng.randn(2, 1000).astype(np.float16).tolist()]


def test_every_member_gets_the_sources_values_whatever_the_dtype_shape_or_chunking():
    held = [net.hold_port("127.0.0.1") for _ in range(3)]
    members = {i: f"127.0.0.1:{s.getsockname()[1]}" for i, s in enumerate(held)}
    for s in held:
        s.close()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    workers = [subprocess.Popen([sys.executable, os.path.join(HERE, "broadcast_worker.py"),
                                 str(i), json.dumps(members)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
               for i in members]
    try:
        outputs = [w.communicate(timeout=120) for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait(timeout=30)
    for w, (_, stderr) in zip(workers, outputs):
        assert w.returncode == 0, stderr[-3000:]
    lines = [json.loads(line) for out, _ in outputs for line in out.splitlines()]
    by_generation = {g: [r for r in lines if r["generation"] == g] for g in (1, 2)}
    # Generation 1 from node 1, generation 2 from node 0: node 1's values stay everywhere.
    for generation in (1, 2):
        assert len(by_generation[generation]) == 3
        for record in by_generation[generation]:
            assert record["values"] == _initial(1), (generation, record["node"])
    # 64-byte chunks: the 37x5 float32 variable goes in 12 pieces, the empty one in none.
    assert lines[0]["chunks"] == [12, 1, 1, 1, 1, 0, 63]
