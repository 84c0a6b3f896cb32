"""benchmarks/chaos.py's --net_faults: every network fault, or those named, in the order given."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import pytest

_BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "benchmarks")


@pytest.fixture(scope="module")
def chaos():
    sys.path.insert(0, _BENCHMARKS)  # chaos.py imports its harness as a sibling
    try:
        spec = importlib.util.spec_from_file_location("benchmark_chaos",
                                                      os.path.join(_BENCHMARKS, "chaos.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(_BENCHMARKS)
        sys.modules.pop("benchmark_chaos", None)


def test_named_network_faults_are_kept_in_their_order(chaos):
    assert chaos.net_fault_kinds("delay") == ["delay"]
    assert chaos.net_fault_kinds("partition, loss") == ["partition", "loss"]


@pytest.mark.parametrize("names", ["", "delay,jitter", ","])
def test_an_unknown_or_empty_list_is_refused(chaos, names):
    with pytest.raises(argparse.ArgumentTypeError, match="network faults are"):
        chaos.net_fault_kinds(names)
