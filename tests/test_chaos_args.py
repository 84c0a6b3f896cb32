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
