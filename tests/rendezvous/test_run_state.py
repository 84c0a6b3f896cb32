"""The snapshot a run is saved as: what a restarted orchestrator reads back."""

from __future__ import annotations

import collections
import json
import time

import pytest

from tensorflow_elastic.rendezvous.run_state import Node, RunState, decode, encode
from tensorflow_elastic.rendezvous.settings import RunSettings
from tensorflow_elastic.rendezvous.types import Phase

SETTINGS = RunSettings(history_size=3)


def _active_run() -> RunState:
    state = RunState.new("job", 2, 4, SETTINGS)
    for node_id, nonce in ((0, "n0"), (1, ""), (2, "n2"), (3, "n3"), (4, "n4")):
        state.add_node(Node(node_id, f"10.0.0.{node_id}:2222", nonce))
    state.next_id = 6
    state.generation = 2
    state.phase = Phase.ACTIVE
    state.reason = "lost [4]: left"
    state.members = {0: "10.0.0.0:2222", 1: "10.0.0.1:2222"}
    state.waiting = {2: state.nodes[2]}  # 3 registered only
    state.remove_node(4, "left: done")
    state.past = collections.OrderedDict([(1, frozenset({0, 1, 4})), (2, frozenset({0, 1}))])
    for node_id, value in ((0, b"\x00\xff"), (1, b"b")):
        state.gathers.put("synchronize/addr", node_id, value, state.members.keys())
    state.blocklist.record_failure("10.0.0.9:2222", now=time.time())
    state.blocklist.record_failure("10.0.0.9:2222", now=time.time())
    for i in range(5):
        state.history.append({"time": float(i), "event": "node_joined", "generation": 0,
                              "nodes": [i], "detail": f"waiting, address {i}"})
    return state


def test_a_snapshot_decodes_to_the_state_it_was_taken_of():
    state = _active_run()
    snapshot = json.loads(json.dumps(encode(state)))  # as the file store writes and reads it
    restored = decode(snapshot, SETTINGS)

    assert (restored.run_id, restored.min_nodes, restored.max_nodes) == ("job", 2, 4)
    assert (restored.next_id, restored.generation, restored.reason) == (6, 2, "lost [4]: left")
    assert restored.phase is Phase.ACTIVE
    assert restored.nodes == state.nodes and sorted(restored.nodes) == [0, 1, 2, 3]
    assert restored.nonces == {"n0": 0, "n2": 2, "n3": 3}
    assert restored.members == state.members
    assert restored.waiting == {2: Node(2, "10.0.0.2:2222", "n2")}
    assert restored.removed == {4: "left: done"}
    assert restored.past == state.past
    assert restored.gathers.completed == {"synchronize/addr": {0: b"\x00\xff", 1: b"b"}}
    assert restored.blocklist.snapshot() == state.blocklist.snapshot()
    assert [entry["nodes"] for entry in restored.history] == [[2], [3], [4]]
    assert restored.history.maxlen == 3
    assert restored.below_min_at is None
    assert encode(restored) == snapshot


def test_the_below_min_deadline_survives_as_wall_clock_time():
    state = RunState.new("job", 3, 3, SETTINGS)
    state.below_min_at = time.monotonic() + 120.0
    snapshot = encode(state)
    assert snapshot["below_min_at"] == pytest.approx(time.time() + 120.0, abs=1.0)
    assert decode(snapshot, SETTINGS).below_min_at == pytest.approx(state.below_min_at, abs=0.01)


@pytest.mark.parametrize("end", [Phase.COMPLETED, Phase.FAILED])
def test_an_ended_run_stays_ended_after_a_restart(end):
    state = RunState.new("job", 1, 1, SETTINGS)
    state.next_id, state.generation, state.phase, state.reason = 3, 2, end, "why"
    restored = decode(json.loads(json.dumps(encode(state))), SETTINGS)
    assert (restored.phase, restored.reason, restored.next_id, restored.generation) == (
        end, "why", 3, 2)


def test_a_snapshot_of_another_format_is_refused():
    snapshot = encode(RunState.new("job", 1, 1, SETTINGS))
    snapshot["format"] += 1
    with pytest.raises(ValueError, match="'job': unknown state format"):
        decode(snapshot, SETTINGS)


def test_a_removed_node_frees_its_nonce_but_not_its_id():
    state = RunState.new("job", 1, 2, SETTINGS)
    state.add_node(Node(0, "10.0.0.1:2222", "n0"))
    state.waiting[0] = state.nodes[0]
    assert state.remove_node(0, "no heartbeat") == Node(0, "10.0.0.1:2222", "n0")
    assert (state.nodes, state.waiting, state.nonces) == ({}, {}, {})
    assert state.removed == {0: "no heartbeat"}
    assert state.remove_node(0, "again") is None and state.removed[0] == "no heartbeat"
