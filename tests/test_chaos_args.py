"""benchmarks/chaos.py's --net_faults: every network fault, or those named, in the order given."""

from __future__ import annotations

import argparse

import pytest

from tests import benchmark_scripts


@pytest.fixture(scope="module")
def chaos():
    with benchmark_scripts.loaded("chaos") as module:
        yield module


def test_named_network_faults_are_kept_in_their_order(chaos):
    assert chaos.net_fault_kinds("delay") == ["delay"]
    assert chaos.net_fault_kinds("partition, loss") == ["partition", "loss"]


@pytest.mark.parametrize("names", ["", "delay,jitter", ","])
def test_an_unknown_or_empty_list_is_refused(chaos, names):
    with pytest.raises(argparse.ArgumentTypeError, match="network faults are"):
        chaos.net_fault_kinds(names)


class _Events:
    def __init__(self, events):
        self.events = events

    def poll(self, event=None):
        return [e for e in self.events if event is None or e["event"] == event]


class _Job:
    def __init__(self, events):
        self.events = _Events(events)


def test_a_survivor_that_left_after_the_fault_stops_the_wait_saying_why(chaos):
    """Its first step of a later generation would never come: no 180 s wait for it."""
    left = {"event": "node_left", "time": 10.0, "node": 4, "reason": "state layout mismatch"}
    before = dict(left, time=5.0, node=5)
    chaos.survivors_stayed(_Job([before, dict(left, node=9)]), [4, 5], t0=8.0)
    with pytest.raises(RuntimeError, match="survivor 4 left .*state layout mismatch"):
        chaos.survivors_stayed(_Job([before, left]), [4, 5], t0=8.0)
