"""A worker's phase: the allowed moves, the final ones, and what each move leaves behind."""

import pytest

from tensorflow_elastic.errors import ElasticJobFailed
from tensorflow_elastic.membership.phase import (ALLOWED, LIVE, IllegalTransition, PhaseMachine,
                                                 WorkerPhase)
from tensorflow_elastic.membership.session import MembershipSession
from tensorflow_elastic.rendezvous.errors import NODE_REMOVED_MAY_RETURN, NodeRemovedError
from tensorflow_elastic.observability.events import EventLog, read_events
from tensorflow_elastic.rendezvous.types import HeartbeatInfo, Membership, NodeBounds, Phase

P = WorkerPhase


def _at(*path: WorkerPhase) -> PhaseMachine:
    machine = PhaseMachine("node 3")
    for phase in path:
        machine.move(phase, f"to {phase.value}")
    return machine


@pytest.mark.parametrize("path", [
    (P.MEMBER, P.REFORMING, P.MEMBER),                       # a re-form
    (P.STANDBY, P.REFORMING, P.MEMBER),                      # a newcomer enters training
    (P.MEMBER, P.STEPPED_ASIDE, P.MEMBER),                   # stuck, recovered in place
    (P.MEMBER, P.STEPPED_ASIDE, P.REMOVED, P.REFORMING, P.MEMBER),  # stuck, removed, back
    (P.MEMBER, P.REFORMING, P.REMOVED, P.REFORMING, P.MEMBER),      # removed while re-forming
    (P.MEMBER, P.REFORMING, P.LEAVING, P.FINISHED),          # a planned leave
    (P.MEMBER, P.LEAVING, P.FINISHED),                       # training is over
])
def test_the_protocol_s_paths_are_allowed_and_recorded(path):
    machine = _at(*path)
    assert machine.phase is path[-1]
    assert [(t.source, t.target) for t in machine.history] == list(zip((P.JOINING,) + path, path))
    assert machine.reason == f"to {path[-1].value}"


@pytest.mark.parametrize("path, target", [
    ((), P.REFORMING),                          # nothing to re-form before a first join
    ((P.STANDBY,), P.MEMBER),                   # a newcomer joins through a re-form
    ((P.MEMBER, P.REMOVED), P.MEMBER),          # a removed node comes back through a re-form
    ((P.MEMBER, P.LEAVING, P.FINISHED), P.MEMBER),
])
def test_a_move_the_protocol_lacks_is_a_bug_that_names_both_phases(path, target):
    machine = _at(*path)
    with pytest.raises(IllegalTransition, match=f"node 3: no move from .* to {target.value}"):
        machine.move(target, "test")
    assert machine.phase is (path[-1] if path else P.JOINING)


def test_nothing_goes_on_after_a_failure_and_every_move_raises_its_reason():
    machine = _at(P.MEMBER, P.FAILED)
    for target in (P.REFORMING, P.LEAVING, P.MEMBER):
        with pytest.raises(ElasticJobFailed, match="to failed"):
            machine.move(target)
    assert machine.phase is P.FAILED


def test_background_news_the_training_thread_overtook_changes_nothing():
    machine = _at(P.MEMBER, P.LEAVING, P.FINISHED)
    assert not machine.move(P.FAILED, "heartbeats stopped", only_from=LIVE)
    assert machine.phase is P.FINISHED


def test_every_phase_but_the_final_ones_can_fail():
    assert {phase for phase in LIVE if P.FAILED not in ALLOWED[phase]} == set()
    assert ALLOWED[P.FINISHED] == ALLOWED[P.FAILED] == set()


class _Client:
    node_id = 3

    def __init__(self):
        self.heartbeats_stopped = 0

    def stop_heartbeats(self):
        self.heartbeats_stopped += 1


def _member() -> MembershipSession:
    session = MembershipSession(_Client(), "127.0.0.1:1", NodeBounds(1, 2))
    session.membership = Membership(3, 4, {3: "a", 5: "b"}, 3)
    session.phases.move(P.MEMBER, "joined generation 4")
    return session


def test_a_stuck_member_steps_aside_once_and_stops_heartbeating():
    session = _member()
    session._step_aside("no commit for 300 s and the main thread is not in TensorFlow")
    session._step_aside("no commit for 600 s and the main thread is not in TensorFlow")
    assert session.phase is P.STEPPED_ASIDE and session.client.heartbeats_stopped == 1
    assert session.absence.reason == "node 3 stepped aside after no commit for 300 s and the " \
                                     "main thread is not in TensorFlow"
    assert session.moved_on()  # the others may be going on without it


def test_a_re_forming_node_steps_aside_never():
    session = _member()
    session.begin_reform("test")
    session._step_aside("no commit for 300 s")
    assert session.phase is P.REFORMING and session.absence is None


def test_a_removal_stops_the_collectives_and_is_a_vote_to_re_form():
    lost = []
    session = _member()
    session._on_peers_lost = lambda reason, generation: lost.append((reason, generation))
    session._note_removed(NodeRemovedError("node 3 was removed from run job (no heartbeat "
                                           "for 1.5 s); it may come back",
                                           reason=NODE_REMOVED_MAY_RETURN))
    assert session.phase is P.REMOVED and session.wants_reform()
    assert lost == [("this node was removed: node 3 was removed from run job (no heartbeat for "
                     "1.5 s)", None)]


def test_a_failed_run_fails_the_next_commit_with_its_reason():
    session = _member()
    session._fail("the orchestrator ended the run")
    with pytest.raises(ElasticJobFailed, match="the orchestrator ended the run"):
        session.check_job_alive()
    with pytest.raises(ElasticJobFailed, match="the orchestrator ended the run"):
        session.begin_reform("test")


class _JoiningClient(_Client):
    """Takes the node back into generation 5 at its join; its barriers and gathers pass."""

    def __init__(self, on_join=lambda: None):
        super().__init__()
        self.on_join = on_join
        self.left = []

    def join(self, address, min_nodes, max_nodes, timeout):
        self.on_join()
        return Membership(3, 5, {3: "a", 5: "b"}, 3)

    def barrier(self, name, timeout):
        pass

    def synchronize(self, key, value, timeout):
        return {3: value, 5: value}

    def start_heartbeats(self, interval, on_heartbeat, on_stopped):
        pass

    def leave(self, reason, job_finished=False):
        self.left.append(reason)


def _removed_error():
    return NodeRemovedError("node 3 was removed from run job (no heartbeat for 1.5 s); it may "
                            "come back", reason=NODE_REMOVED_MAY_RETURN)


def test_a_removal_heard_while_re_joining_ends_with_the_node_a_member_again():
    session = _member()
    session.client = _JoiningClient(on_join=lambda: session._note_removed(_removed_error()))
    session.begin_reform("a peer was lost")
    assert session.start_generation(session.join_next_generation(), b"")
    assert session.phase is P.MEMBER and session.absence is None


def test_a_job_that_fails_while_a_node_leaves_lets_it_finish():
    session = _member()
    session.client = _JoiningClient()
    session.phases.move(P.LEAVING, "training finished")
    session._fail("heartbeats stopped")
    assert session.phase is P.LEAVING
    session._on_heartbeats_stopped(RuntimeError("orchestrator gone"))
    session.finish(step=9)
    assert session.phase is P.FINISHED and session.client.left == ["job complete"]


def test_a_failed_run_is_news_of_an_ended_generation_too():
    session = _member()
    session._on_heartbeat(HeartbeatInfo(4, Phase.FAILED, 0, 0, True, 0))
    assert session.phase is P.FAILED and session.wants_reform() and session.moved_on()


def test_a_removed_standby_node_stays_one_and_comes_back_when_it_joins(tmp_path):
    session = MembershipSession(_JoiningClient(), "127.0.0.1:1", NodeBounds(1, 2))
    session.events = EventLog(str(tmp_path / "events.jsonl"))
    session.phases.move(P.STANDBY, "the job runs already")
    session._note_removed(_removed_error())
    assert session.phase is P.STANDBY and session.absence is not None
    assert [e["reason"] for e in read_events(str(tmp_path / "events.jsonl"), "node_left")] == \
        ["removed: node 3 was removed from run job (no heartbeat for 1.5 s)"]
    assert session.start_generation(session.join_next_generation(), b"")
    assert session.phase is P.MEMBER and session.absence is None
