"""A run's state: its pure transitions, and the snapshot a restarted orchestrator reads."""

from __future__ import annotations

import collections
import json
import time

import pytest

from tensorflow_elastic.rendezvous.run_state import (
    PAST_GENERATIONS, AfterRemoval, Forming, JoinStep, Node, RunState, decode, encode)
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


# ----------------------------------------------------------- the pure transitions


def _run(min_nodes: int = 2, max_nodes: int = 3, members: tuple[int, ...] = (),
         waiting: tuple[int, ...] = (), registered: tuple[int, ...] = ()) -> RunState:
    """A run whose generation 1 has ``members`` (FORMING when there are none)."""
    state = RunState.new("job", min_nodes, max_nodes, SETTINGS)
    for node_id in sorted(members + waiting + registered):
        state.add_node(Node(node_id, f"10.0.0.{node_id}:2222"))
    state.next_id = max(members + waiting + registered, default=-1) + 1
    if members:
        state.form(members, "formed")
    for node_id in waiting:
        state.enqueue(state.nodes[node_id])
    return state


@pytest.mark.parametrize("run, ids, failed, removed, lost, after", [
    (dict(members=(0, 1, 2), waiting=(3,)), [1], True, [1], [1], AfterRemoval.RE_FORM),
    (dict(members=(0, 1)), [1], True, [1], [1], AfterRemoval.FALL_BELOW_MIN),
    (dict(members=(0, 1), waiting=(2,)), [1], False, [1], [1], AfterRemoval.RE_FORM),
    (dict(members=(0, 1)), [0, 1], False, [0, 1], [0, 1], AfterRemoval.COMPLETE),
    (dict(members=(0, 1)), [0, 1], True, [0, 1], [0, 1], AfterRemoval.FALL_BELOW_MIN),
    (dict(members=(0, 1), waiting=(2,)), [2], True, [2], [], AfterRemoval.MAYBE_FORM),
    (dict(waiting=(0,)), [0], False, [0], [], AfterRemoval.COMPLETE),
    (dict(waiting=(0, 1)), [1], True, [1], [], AfterRemoval.MAYBE_FORM),
    (dict(members=(0, 1)), [7, 1, 1], True, [1], [1], AfterRemoval.FALL_BELOW_MIN),
], ids=["member-fails-enough-remain", "member-fails-too-few-remain", "member-leaves-waiting-fill",
        "everyone-leaves", "everyone-fails", "waiting-node-fails", "last-waiting-leaves",
        "forming-node-fails", "unknown-and-repeated-ids"])
def test_remove_says_what_it_removed_and_what_the_run_does_next(run, ids, failed, removed, lost,
                                                                 after):
    state = _run(**run)
    members_before = dict(state.members)
    removal = state.remove(ids, "why", failed)
    assert (removal.removed, removal.lost, removal.next) == (removed, lost, after)
    assert not state.nodes.keys() & set(removed)
    assert all(state.removed[node_id] == "why" for node_id in removed)
    assert state.members == members_before  # members change only when a generation ends


def test_remove_blocklists_failed_members_only_and_marks_the_silent_returnable():
    state = _run(min_nodes=1, members=(0, 1), waiting=(2,))
    state.remove([0, 2], "no heartbeat", failed=True, may_return=True)
    state.remove([1], "left", failed=False)
    assert [address for address, _ in state.blocklist.snapshot().items()] == ["10.0.0.0:2222"]
    assert state.returnable == {0: "10.0.0.0:2222", 2: "10.0.0.2:2222"}


@pytest.mark.parametrize("run, forming", [
    (dict(min_nodes=2, max_nodes=3), Forming.TOO_FEW),
    (dict(min_nodes=2, max_nodes=3, waiting=(0,)), Forming.TOO_FEW),
    (dict(min_nodes=2, max_nodes=3, waiting=(0, 1)), Forming.ENOUGH),
    (dict(min_nodes=2, max_nodes=3, waiting=(0, 1, 2)), Forming.FULL),
    (dict(min_nodes=1, max_nodes=1, waiting=(0, 1)), Forming.FULL),
    (dict(min_nodes=1, max_nodes=3, members=(0,), waiting=(1, 2, 3)), None),
])
def test_forming_says_when_the_next_generation_forms(run, forming):
    assert _run(**run).forming() is forming


@pytest.mark.parametrize("node_id, last_generation, step", [
    (0, 1, JoinStep.GROW),    # a member re-joins the generation it runs
    (0, 0, JoinStep.WAIT),    # a member's retried first join: it waits for its answer
    (2, 0, JoinStep.WAIT),    # already waiting
    (3, 0, JoinStep.ENQUEUE),  # registered, now asking to join
    (4, 0, JoinStep.WAIT),    # removed
])
def test_join_step_of_a_known_node(node_id, last_generation, step):
    state = _run(members=(0, 1), waiting=(2,), registered=(3, 4))
    state.remove_node(4, "left")
    assert state.join_step(node_id, last_generation) is step


@pytest.mark.parametrize("run, lost, expected", [
    (dict(max_nodes=3, members=(0, 1), waiting=(5, 3, 4)), [], [0, 1, 3]),
    (dict(max_nodes=3, members=(0, 1, 2), waiting=(3,)), [], [0, 1, 2]),
    (dict(max_nodes=3, members=(0, 1, 2), waiting=(4, 3)), [1], [0, 2, 3]),
    (dict(max_nodes=3, waiting=(4, 0, 2, 1)), [], [0, 1, 2]),
])
def test_next_members_are_the_survivors_then_the_lowest_waiting_ids(run, lost, expected):
    assert _run(**run).next_members(lost) == expected


def test_form_starts_the_next_generation_and_keeps_only_the_recent_past():
    state = _run(min_nodes=1, max_nodes=4, members=(0,), waiting=(1, 2))
    state.below_min_at = 5.0
    state.gathers.put("barrier/a", 0, b"", {0, 1})
    for _ in range(PAST_GENERATIONS + 1):
        assert state.form([2, 0], "grow") == [0, 2]
    assert (state.generation, state.phase, state.reason) == (
        PAST_GENERATIONS + 2, Phase.ACTIVE, "grow")
    assert state.members == {0: "10.0.0.0:2222", 2: "10.0.0.2:2222"}
    assert list(state.waiting) == [1] and state.admissible() == 1
    assert state.below_min_at is None and len(state.gathers) == 0
    assert len(state.past) == PAST_GENERATIONS and min(state.past) == 3
    assert state.removed_since(state.generation) == 0


def test_falling_below_min_puts_the_survivors_back_to_wait_until_a_deadline():
    state = _run(min_nodes=3, max_nodes=3, members=(0, 1, 2))
    state.remove([1], "no heartbeat", failed=True)
    assert state.fall_below_min([1], "no heartbeat", fail_at=42.0) == [0, 2]
    assert (state.phase, state.members, sorted(state.waiting)) == (Phase.FORMING, {}, [0, 2])
    assert state.reason == "lost [1] (no heartbeat); 2 of min_nodes=3 remain"
    assert state.removed_since(1) == 3
    assert not state.below_min_expired(41.9) and state.below_min_expired(42.0)


@pytest.mark.parametrize("end", ["complete", "fail"])
def test_an_ended_run_starts_afresh_without_its_left_over_nodes(end):
    state = _run(min_nodes=1, max_nodes=2, members=(0,), waiting=(1,))
    if end == "complete":
        state.complete([0], "left: done")
        assert state.reason == "completed: every node left (the last: [0], left: done)"
    else:
        state.fail("too few")
    assert state.phase.ended
    assert state.start_afresh(2, 3, SETTINGS) == [0, 1]
    assert (state.phase, state.min_nodes, state.max_nodes, state.nodes, state.members) == (
        Phase.FORMING, 2, 3, {}, {})
    assert state.reason.startswith(f"a new job started it afresh after: run 'job' {end}")
    assert state.removal_cause(1).endswith("a new job started it afresh")
    assert state.register("10.0.0.9:2222", "n9").node_id == 2  # ids keep counting


def test_a_finished_job_forms_nothing_more_whatever_comes_before_the_leaves():
    """A member lost after the exit barrier (its leave never comes) drops the run below
    min_nodes, and a late node then waits: the finished member's leave still ends the job,
    and the waiting node never forms a generation (it would train from nothing)."""
    state = _active_run()  # members 0 and 1 (min_nodes 2)
    state.waiting = {}
    assert state.remove([0], "its process died", failed=True).next is \
        AfterRemoval.FALL_BELOW_MIN
    state.fall_below_min([0], "its process died", fail_at=time.monotonic() + 60)
    state.waiting[2] = state.nodes[2]  # the late node
    assert state.forming() is Forming.ENOUGH
    removal = state.remove([1], "left: job complete", failed=False, job_finished=True)
    assert removal.next is AfterRemoval.COMPLETE
    state.complete([1], "left: job complete")
    assert state.forming() is None
    assert json.loads(json.dumps(encode(state)))["job_finished"] is True


def test_from_the_first_finished_leave_no_member_grows_the_generation():
    state = _active_run()
    removal = state.remove([0], "left: job complete", failed=False, job_finished=True)
    assert removal.next is AfterRemoval.FINISHING
    assert state.join_step(1, state.generation) is JoinStep.WAIT
    assert state.remove([1], "left: job complete", failed=False,
                        job_finished=True).next is AfterRemoval.COMPLETE
