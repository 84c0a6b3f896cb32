"""Hosts on separate network stacks (tools/netns.py): the orchestrator on one, a launcher with one
elastic worker on each of three others. A host cut off mid-step (no reset, as after a power loss
or a partition) is removed at its heartbeat timeout and the others go on; when its link comes back
its worker, still running, rejoins and the job ends with every global batch trained on exactly
once. Skipped where network namespaces cannot be made (not root)."""

from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest

from tensorflow_elastic.observability import events

from tests.conftest import netns_hosts
from tests.launch.conftest import ELASTIC_WORKER
from tests.strategy.replay import replay

pytestmark = pytest.mark.multiprocess

PORT = 29400
STEPS = 200
STEP_SLEEP_S = "0.05"


@pytest.fixture
def hosts():
    with netns_hosts(4) as made:
        yield made


def _records(proc) -> list[tuple[float, dict]]:
    """(arrival time, record) of every JSON line the launcher's worker printed."""
    found = []
    for arrived, line in zip(list(proc.times), list(proc.lines)):
        m = re.match(r"^\[node \d+\] (\{.*\})$", line)
        if m:
            found.append((arrived, json.loads(m.group(1))))
    return found


def start_training(hosts, start, events_file, steps: int) -> list:
    """The orchestrator on host 0 and a launcher with one elastic worker on each of hosts 1-3,
    training `steps` global batches; returns the launchers once all three train together."""
    endpoint = f"{hosts.address(0)}:{PORT}"
    start("--host", hosts.address(0), "--port", str(PORT), "--insecure",
          "--events_file", str(events_file), module="tensorflow_elastic.rendezvous",
          wrap=lambda argv: hosts.command(0, argv)).wait_for(r"listening on ")
    launchers = [start(f"--rdzv_endpoint={endpoint}", "--nnodes=2:3", "--monitor_interval=0.5",
                       "--max_restarts=0", f"--events_file={events_file}", ELASTIC_WORKER,
                       str(steps), STEP_SLEEP_S, wrap=lambda argv, i=i: hosts.command(i, argv))
                 for i in (1, 2, 3)]
    for proc in launchers:
        proc.wait_for(r'"step": 30, .*"world": 3')
    return launchers


def finished_exactly_once(launchers: list, steps: int) -> list[dict]:
    """Every launcher ends with 0, all three workers with the same weights, those of a replay of
    `steps` global batches in one process (each trained on exactly once); returns their results."""
    for proc in launchers:
        assert proc.wait() == 0, proc.tail()
    results = [r for proc in launchers for _, r in _records(proc) if r.get("done")]
    assert len(results) == 3
    assert all(r["weights"] == results[0]["weights"] for r in results)
    np.testing.assert_allclose(results[0]["weights"], replay(steps), rtol=1e-4, atol=1e-5)
    return results


def test_a_host_cut_off_mid_step_is_removed_the_others_go_on_and_it_rejoins(hosts, start,
                                                                           tmp_path):
    events_file = tmp_path / "events.jsonl"
    launchers = start_training(hosts, start, events_file, STEPS)
    survivors, victim = launchers[:2], launchers[2]
    generation = max(r["generation"] for _, r in _records(victim))
    hosts.link_down(3)  # mid-step: the steps are back to back
    cut_at, cut_at_wall = time.monotonic(), time.time()
    for proc in survivors:
        proc.wait_for(r'"world": 2,')
    first_steps = [next(t for t, r in _records(proc) if r.get("generation", 0) > generation)
                   for proc in survivors]
    removed_at = next(e["time"] for e in events.read_events(str(events_file), events.NODE_LEFT)
                      if e.get("source") == "orchestrator")
    print(f"link down -> removal {removed_at - cut_at_wall:.3f} s, -> each survivor's first step "
          f"in the new generation: {[round(t - cut_at, 3) for t in first_steps]} s")
    time.sleep(3.0)  # well past the heartbeat timeout: the host was removed
    hosts.link_up(3)
    victim.wait_for(r"was removed from run .*\(no heartbeat for 1.5 s\) and rejoined at "
                    r"generation \d+")
    results = finished_exactly_once(launchers, STEPS)
    assert _records(victim)[-2][1]["world"] == 3  # it trained again, among the members
    failures = list(events.read_events(str(events_file), events.FAILURE_DETECTED))
    victim_node = results[2]["node"]
    assert any(f["failed"] == [victim_node] and "no heartbeat" in f["cause"] for f in failures
               if f.get("source") == "orchestrator")
