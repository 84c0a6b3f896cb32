"""An asymmetric partition between two worker hosts (tools/netns.py): each still reaches the
orchestrator, but they lose every packet to and from each other, so the collective they share
waits with no error. Their slow step makes both probe their peers and report each other; the
orchestrator, which reaches both, removes one side (the higher node id) and blocks its address
for the cooldown: the job re-forms once without it, within seconds, and no re-form loop follows.
Once healed, the removed worker rejoins and the job ends with every global batch trained on
exactly once. Skipped where network namespaces or iptables are not available."""

from __future__ import annotations

import time

import pytest

from tensorflow_elastic.membership.session import PEER_CHECK_AFTER_S
from tensorflow_elastic.observability import events
from tools.netns import FaultUnavailable

from tests.conftest import netns_hosts
from tests.launch.test_vanished_hosts import _records, finished_exactly_once, start_training

pytestmark = pytest.mark.multiprocess

STEPS = 700
# The slow step's probe (PEER_CHECK_AFTER_S, then a 1 s probe timeout), the orchestrator's probes
# and a re-form, with room for two shared cores.
REMOVED_WITHIN_S = PEER_CHECK_AFTER_S + 10.0
QUIET_S = 6.0  # after the removal: no further generation (the blocklist cooldown is 10 s)


@pytest.fixture
def hosts():
    with netns_hosts(4) as made:
        yield made


def _orchestrator_events(path, kind: str) -> list[dict]:
    return [e for e in events.read_events(str(path), kind) if e.get("source") == "orchestrator"]


def test_a_partition_between_two_workers_removes_one_side_once_and_the_job_goes_on(
        hosts, start, tmp_path):
    events_file = tmp_path / "events.jsonl"
    launchers = start_training(hosts, start, events_file, STEPS)
    try:
        hosts.drop(2, peer=3)
    except FaultUnavailable as e:
        pytest.skip(str(e))
    cut_at = time.time()
    deadline = time.monotonic() + REMOVED_WITHIN_S
    while not (left := [e for e in _orchestrator_events(events_file, events.NODE_LEFT)
                        if e["time"] > cut_at]):
        assert time.monotonic() < deadline, f"nobody removed {REMOVED_WITHIN_S} s after the cut"
        time.sleep(0.1)
    [removal] = left
    assert "partition" in removal["reason"], removal
    removed_at = removal["time"]
    time.sleep(QUIET_S)
    generations = [e for e in _orchestrator_events(events_file, events.GENERATION_START)
                   if e["time"] > cut_at]
    hosts.heal(2)
    print(f"partition -> removal of node {removal['node']} {removed_at - cut_at:.2f} s; "
          f"generations since: {[(g['generation'], g['members']) for g in generations]}")
    assert len(generations) == 1, generations  # one re-form, no loop
    assert removal["node"] not in generations[0]["members"]
    assert len(generations[0]["members"]) == 2
    victim = next(proc for proc in launchers[1:]
                  if any(r.get("node") == removal["node"] for _, r in _records(proc)))
    victim.wait_for(r"was removed from run .*partition.* and rejoined at generation \d+",
                    timeout=60)
    finished_exactly_once(launchers, STEPS)
