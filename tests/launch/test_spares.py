"""A warm spare (--spares): a worker killed, the spare joins in its place, every example trained
exactly once."""

import json
import os
import re
import signal

import numpy as np
import pytest

from tests.launch.conftest import ELASTIC_WORKER
from tests.strategy.replay import replay

pytestmark = pytest.mark.multiprocess

STEPS = 240


def test_a_warm_spare_takes_a_killed_workers_place_and_every_example_is_trained_once(start):
    proc = start("--standalone", "--nworkers=1:2", "--nproc_per_node=2", "--spares=1",
                 "--max_restarts=1", "--monitor_interval=0.5", "--stop_timeout=30",
                 ELASTIC_WORKER, str(STEPS), "0.03")
    proc.wait_for(r"^\[spare 0\] node \d+ is a spare, ready")
    proc.wait_for(r'"step": 60, ')
    victim = proc.worker_pids()[1][0]
    os.kill(victim, signal.SIGKILL)
    proc.wait_for(r"restart 1 of 1: spare 0 \(pid \d+\) joins in place of worker 1")
    assert proc.wait(120) == 0, proc.tail()
    assert proc.worker_pids() == {0: proc.worker_pids()[0], 1: [victim]}, "a worker was started"
    proc.wait_for(r"\[agent\] spare 1 started")  # the pool refilled, then was dismissed
    # It exits by itself once the job is complete, or leaves when told (SIGTERM ends one that
    # still imports).
    proc.wait_for(r"\[agent\] spare 1 (exited|not needed: it left \(exit code (0|-15)\))")
    records = [json.loads(m.group(1)) for m in map(re.compile(r"^\[node \d+\] (\{.*\})$").match,
                                                       proc.lines) if m]
    results = [r for r in records if r.get("done")]
    assert len(results) == 2, proc.tail()
    assert results[0]["weights"] == results[1]["weights"]
    np.testing.assert_allclose(results[0]["weights"], replay(STEPS), rtol=1e-4, atol=1e-5)
    first = {r["node"] for r in records if r.get("step") == 60}
    spare = next(r for r in results if r["node"] not in first)
    assert spare["traced_in"] == [0], "the spare traced its step again after it joined"
