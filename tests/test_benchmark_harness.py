"""The pure parts of benchmarks/harness.py: the statistics the benchmarks report and the
events file read as it grows."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import sys

import pytest

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks",
                     "harness.py")
_spec = importlib.util.spec_from_file_location("benchmark_harness", _PATH)
harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harness)

TEN = [7.0, 3.0, 10.0, 1.0, 5.0, 9.0, 2.0, 8.0, 4.0, 6.0]  # 1 to 10, unordered


@pytest.mark.parametrize("q, expected", [(0, 1.0), (10, 2.0), (50, 6.0), (90, 10.0),
                                         (95, 10.0), (99, 10.0), (100, 10.0)])
def test_percentile_is_the_smallest_value_more_than_q_percent_are_at_or_below(q, expected):
    assert harness.percentile(TEN, q) == expected


def test_percentile_of_one_value_and_of_a_generator():
    assert harness.percentile([0.25], 99) == 0.25
    assert harness.percentile((x for x in [3.0, 1.0, 2.0, 4.0]), 50) == 3.0


def test_percentile_counts_more_than_q_percent():
    # 99 values of 0 and one of 1: 99 % of them are at or below 0, not more.
    values = [0.0] * 99 + [1.0]
    random.Random(0).shuffle(values)
    assert harness.percentile(values, 98) == 0.0
    assert harness.percentile(values, 99) == 1.0


@pytest.mark.parametrize("q, expected", [(0, 1.0), (10, 2.0), (50, 5.0), (90, 9.0),
                                         (95, 10.0), (100, 10.0)])
def test_nearest_rank_percentile_rounds_the_position_between_smallest_and_largest(q, expected):
    # Position q % of the way over indices 0..9: 0.9 -> 1, 4.5 -> 4 (half to even), 8.1 -> 8,
    # 8.55 -> 9.
    assert harness.nearest_rank_percentile(TEN, q) == expected


def test_nearest_rank_percentile_of_one_value():
    assert harness.nearest_rank_percentile([2.5], 90) == 2.5


def test_gaps():
    assert harness.gaps([1.0, 1.5, 3.0, 3.25]) == [0.5, 1.5, 0.25]
    assert harness.gaps([4.0]) == []
    assert harness.gaps([]) == []


def test_durations_times_each_call():
    calls = []
    seconds = harness.durations(lambda: calls.append(1), 7)
    assert len(calls) == 7
    assert len(seconds) == 7 and all(s >= 0 for s in seconds)


def _append(path: str, text: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


def test_event_tail_reads_what_was_added_and_keeps_a_partial_line(tmp_path):
    path = str(tmp_path / "events.jsonl")
    tail = harness.EventTail(path)
    assert tail.poll() == []  # no file yet
    first = {"event": "node_joined", "node": 1, "time": 1.0}
    second = {"event": "generation_start", "generation": 1, "members": [1], "time": 2.0}
    third = {"event": "node_joined", "node": 2, "time": 3.0}
    line = json.dumps(third)
    _append(path, json.dumps(first) + "\n\n" + json.dumps(second) + "\n" + line[:10])
    assert tail.poll() == [first, second]
    _append(path, line[10:])
    assert tail.poll() == [first, second]  # still no newline: still being written
    _append(path, "\n")
    assert tail.poll() == [first, second, third]
    assert tail.poll("node_joined") == [first, third]
    assert tail.poll("failure_detected") == []
    assert tail.poll() == [first, second, third]  # nothing read twice


def test_event_tail_reads_a_line_split_anywhere(tmp_path):
    path = str(tmp_path / "events.jsonl")
    events = [{"event": "e", "i": i, "text": "x" * i} for i in range(20)]
    data = "".join(json.dumps(e) + "\n" for e in events)
    tail = harness.EventTail(path)
    cuts = sorted(random.Random(1).sample(range(1, len(data)), 30))
    for start, stop in zip([0] + cuts, cuts + [len(data)]):
        _append(path, data[start:stop])
        assert tail.poll() == events[:data[:stop].count("\n")]
    assert tail.poll() == events


def test_tf_config():
    addresses = ["127.0.0.1:2000", "127.0.0.1:2001"]
    assert json.loads(harness.tf_config(addresses, 1)) == {
        "cluster": {"worker": addresses}, "task": {"type": "worker", "index": 1}}


def test_child_env(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setenv("TFE_EVENTS_FILE", "/tmp/events.jsonl")
    env = harness.child_env("2", unset=("TFE_EVENTS_FILE",), TFE_RUN_ID="run")
    assert env["PYTHONPATH"].split(os.pathsep) == [harness.REPO, "/elsewhere"]
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "2" and env["TFE_RUN_ID"] == "run"
    assert "TFE_EVENTS_FILE" not in env
    assert harness.child_env()["TF_CPP_MIN_LOG_LEVEL"] == "3"
    assert os.environ["TFE_EVENTS_FILE"] == "/tmp/events.jsonl"  # ours is left alone


def test_wait_until_returns_the_first_true_value():
    values = iter([None, 0, [], {"node": 3}, {"node": 4}])
    assert harness.wait_until(lambda: next(values), "a value", timeout=5, interval=0) == {
        "node": 3}


def test_wait_until_times_out_and_checks_between_polls():
    with pytest.raises(TimeoutError, match="waiting for nothing"):
        harness.wait_until(lambda: None, "nothing", timeout=0.05, interval=0.01)

    def check():
        raise RuntimeError("exited")

    with pytest.raises(RuntimeError, match="exited"):
        harness.wait_until(lambda: None, "nothing", timeout=5, check=check)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_status_mb_and_free_port():
    assert harness.status_mb("self", "VmRSS") > 1
    assert harness.status_mb("self", "NoSuchField") is None
    ports = [harness.free_port() for _ in range(20)]
    assert len(set(ports)) == 20
    assert all(1024 <= p < harness._ephemeral_ports_start() for p in ports)
