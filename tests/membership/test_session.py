"""The membership session's protocol: checks with a stand-in client, and with an embedded
orchestrator where the session must react to what the orchestrator did."""

import threading
import time

import pytest

from tensorflow_elastic.errors import ElasticJobFailed
from tensorflow_elastic.rendezvous import Client, Membership, Orchestrator
from tensorflow_elastic.rendezvous.errors import (NODE_REMOVED_MAY_RETURN,
                                                  GenerationChangedError, NodeRemovedError,
                                                  RendezvousError)
from tensorflow_elastic.membership.phase import WorkerPhase
from tensorflow_elastic.membership.session import PEER_CHECK_AFTER_S, MembershipSession
from tensorflow_elastic.rendezvous.settings import RunSettings
from tensorflow_elastic.rendezvous.types import HeartbeatInfo, MembershipUpdate, NodeBounds, Phase


class _UnusedClient:
    """The checks below never talk to the orchestrator."""


@pytest.fixture
def job():
    return MembershipSession(_UnusedClient(), "127.0.0.1:1", NodeBounds(2, 4))


@pytest.mark.parametrize("bounds", [(0, 2), (3, 2)])
def test_bad_bounds_are_refused(bounds):
    with pytest.raises(ValueError, match="min_nodes <= max_nodes"):
        NodeBounds(*bounds)


def test_waiting_nodes_trigger_a_reform_only_below_max_nodes(job):
    job.membership = Membership(0, 1, {0: "a", 1: "b"}, 0)
    assert not job.wants_reform()
    job._waiting = 1
    assert job.wants_reform()
    job.membership = Membership(0, 2, {0: "a", 1: "b", 2: "c", 3: "d"}, 0)
    assert not job.wants_reform()  # already max_nodes: nobody more can come in


def test_a_leave_request_is_a_vote_to_reform(job):
    job.request_leave()
    assert job.wants_reform() and job.leave_requested


class _BarrierClient:
    """Records barriers and the session's phase during each; can fail one."""

    def __init__(self, session_of, error=None):
        self.session_of = session_of
        self.error = error
        self.barriers = []

    def barrier(self, name, timeout):
        self.barriers.append((name, self.session_of().phase))
        if self.error is not None:
            raise self.error


def _member_of_generation_7(barrier_error=None):
    session = MembershipSession(_UnusedClient(), "127.0.0.1:1", NodeBounds(2, 4))
    session.client = _BarrierClient(lambda: session, barrier_error)
    session.membership = Membership(0, 7, {0: "a", 1: "b"}, 0)
    session.phases.move(WorkerPhase.MEMBER, "joined generation 7")
    return session


def test_a_planned_change_waits_for_every_member_to_finish_the_step():
    session = _member_of_generation_7()
    session.finish_step_together()
    # Re-forming already: watch-stream news during the barrier must not vote again.
    assert session.client.barriers == [("change-7", WorkerPhase.REFORMING)]
    session._note_generation_ended("membership changed", 8)
    assert not session.wants_reform()


def test_a_failure_while_members_finish_the_step_is_left_to_the_re_form():
    session = _member_of_generation_7(GenerationChangedError("generation 7 ended"))
    session.finish_step_together()
    assert session.client.barriers == [("change-7", WorkerPhase.REFORMING)]
    assert session.phase is WorkerPhase.REFORMING


def _reform(session: MembershipSession) -> None:
    """The session's part of a re-form, as the runtime drives it (no TensorFlow to move here)."""
    while not session.start_generation(session.join_next_generation(), b""):
        pass


def _watching_session(endpoint: str, max_nodes: int) -> tuple[MembershipSession, list[str]]:
    """A started session of a one-node job, and the reasons its peers-lost collaborator heard."""
    lost: list[str] = []
    session = MembershipSession(Client(endpoint, "job"), "127.0.0.1:20001",
                                NodeBounds(1, max_nodes),
                                on_peers_lost=lambda reason, generation: lost.append(reason))
    session.start()
    session.start_watching()
    return session, lost


def test_a_node_removed_while_it_trains_fails_loudly_instead_of_hanging(caplog):
    with Orchestrator("127.0.0.1", 0) as server:
        session, lost = _watching_session(server.endpoint, 2)
        try:
            # Its agent (or the heartbeat timeout) removed it while it was busy.
            with Client(server.endpoint, "job") as other:
                other.report_death(session.node_id, "frozen past the heartbeat timeout")
            deadline = time.monotonic() + 20
            while (not any("heartbeats stopped" in reason for reason in lost)
                   and time.monotonic() < deadline):
                time.sleep(0.05)
            with pytest.raises(ElasticJobFailed, match="lost its place in the job"):
                session.check_job_alive()
            assert any("heartbeats stopped" in reason for reason in lost)
            assert "heartbeats to the orchestrator stopped" in caplog.text
        finally:
            session.close()


def test_a_clean_finish_is_no_lost_place():
    with Orchestrator("127.0.0.1", 0) as server:
        session, lost = _watching_session(server.endpoint, 1)
        session.finish(step=3)
        time.sleep(1.5)  # three heartbeat intervals: none may follow the leave
        session.check_job_alive()
        assert lost == []


def test_a_node_removed_while_alive_rejoins_at_its_next_re_form_with_its_id(caplog):
    settings = RunSettings(heartbeat_timeout=1.0, last_call=0.2)
    with Orchestrator("127.0.0.1", 0, settings=settings) as server:
        session, lost = _watching_session(server.endpoint, 2)
        try:
            node_id, generation = session.node_id, session.generation
            session.client.heartbeat()  # it has beaten: silent from here on
            session.client.stop_heartbeats()  # silent past the timeout: a frozen process
            deadline = time.monotonic() + 20
            with Client(server.endpoint, "job") as probe:
                while probe.status()[0].state == Phase.ACTIVE and time.monotonic() < deadline:
                    time.sleep(0.05)
            session._resume_heartbeats()  # it resumes: its next heartbeat finds it removed
            while (not any("this node was removed" in reason for reason in lost)
                   and time.monotonic() < deadline):
                time.sleep(0.05)
            assert any("this node was removed" in reason for reason in lost)
            session.check_job_alive()  # not a failure of the job
            _reform(session)
            assert session.node_id == node_id and session.generation > generation
            assert "(no heartbeat for 1 s) and rejoined at generation" in caplog.text
            time.sleep(1.5)  # heartbeats again: it stays
            session.check_job_alive()
            with Client(server.endpoint, "job") as probe:
                assert probe.status()[0].membership.members.keys() == {node_id}
        finally:
            session.close()


def test_a_removed_node_whose_join_overtakes_its_heartbeat_learns_of_the_removal_there(caplog):
    settings = RunSettings(heartbeat_timeout=1.0, last_call=0.2)
    with Orchestrator("127.0.0.1", 0, settings=settings) as server:
        session, _ = _watching_session(server.endpoint, 2)
        try:
            session.client.heartbeat()  # it has beaten: silent from here on
            session.client.stop_heartbeats()  # frozen past the timeout
            deadline = time.monotonic() + 20
            with Client(server.endpoint, "job") as probe:
                while probe.status()[0].state == Phase.ACTIVE and time.monotonic() < deadline:
                    time.sleep(0.05)
            assert session.absence is None
            _reform(session)  # before any heartbeat told it: the join takes it back
            assert ("(no heartbeat for 1 s) and rejoined at generation "
                    f"{session.generation}\n") in caplog.text
            assert session.membership.taken_back_after
            time.sleep(1.5)  # heartbeats again: it stays
            session.check_job_alive()
            with Client(server.endpoint, "job") as probe:
                assert probe.status()[0].membership.members.keys() == {session.node_id}
        finally:
            session.close()


class _HeartbeatClient:
    """Answers a heartbeat with `reply` (an exception is raised)."""

    node_id = 0

    def __init__(self, reply):
        self.reply = reply

    def heartbeat(self):
        if isinstance(self.reply, Exception):
            raise self.reply
        return self.reply

    def stop_heartbeats(self):
        pass


@pytest.mark.parametrize("reply, moved_on", [
    (HeartbeatInfo(7, Phase.ACTIVE, 0, 0, True, 0), False),
    (HeartbeatInfo(8, Phase.ACTIVE, 0, 0, True, 0), True),
    (NodeRemovedError("node 0 was removed (no heartbeat for 1.5 s); ...",
                      reason=NODE_REMOVED_MAY_RETURN), True),
    (RendezvousError("unreachable"), False),
])
def test_a_failed_collective_is_a_consequence_of_the_change_when_the_job_moved_on(reply,
                                                                                 moved_on):
    session = _member_of_generation_7()
    session.client = _HeartbeatClient(reply)
    assert session.moved_on() == moved_on
    session.check_job_alive()  # a removal that allows a return is no failure of the job


def test_a_member_that_knows_of_a_change_has_moved_on_without_asking():
    session = _member_of_generation_7()
    session._note_generation_ended("membership changed", 8)
    assert session.moved_on()


def test_a_stuck_node_that_recovers_before_its_removal_stays_and_heartbeats_again(caplog):
    with Orchestrator("127.0.0.1", 0, settings=RunSettings(heartbeat_timeout=2.0)) as server:
        session, _ = _watching_session(server.endpoint, 2)
        try:
            session._step_aside("no commit for 300 s and the main thread is not in TensorFlow")
            time.sleep(1.0)  # silent, but not for the whole timeout
            session.report_step(1)  # it commits again
            time.sleep(2.5)
            session.check_job_alive()
            with Client(server.endpoint, "job") as probe:
                assert probe.status()[0].membership.members.keys() == {session.node_id}
            assert "stepped aside after no commit for 300 s" in caplog.text
            assert "recovered 1.0 s later, still a member" in caplog.text
        finally:
            session.close()
            session.client.close()  # ends its watch stream, which would hold the server open


@pytest.mark.parametrize("generation, state, ended", [
    (7, Phase.ACTIVE, False), (8, Phase.ACTIVE, True),
    (7, Phase.FORMING, True),  # below min_nodes: the number stays, the generation is over
])
def test_a_member_notices_the_end_of_its_generation(generation, state, ended):
    session = _member_of_generation_7()
    lost = []
    session._on_peers_lost = lambda reason, live_from: lost.append(live_from)
    session._on_heartbeat(HeartbeatInfo(generation, state, 0, 0, True, 0))
    # Collectives of generation 7 are aborted, never those of the next one, numbered 8.
    assert session.wants_reform() == ended and lost == ([8] if ended else [])


@pytest.mark.parametrize("phase", [WorkerPhase.LEAVING, WorkerPhase.FINISHED])
def test_a_node_whose_training_is_over_aborts_nothing_when_its_generation_ends(phase):
    """A leaver (a preemption notice, the job's end) hears of the generation its leave ended
    while it exits."""
    session = _member_of_generation_7()
    session.phases.move(WorkerPhase.LEAVING, "a leave requested")
    if phase is WorkerPhase.FINISHED:
        session.phases.move(phase, "left")
    lost = []
    session._on_peers_lost = lambda reason, live_from: lost.append(live_from)
    session._on_heartbeat(HeartbeatInfo(8, Phase.ACTIVE, 0, 0, True, 0))
    session._note_generation_ended("membership changed", 9)
    assert lost == []


def test_a_removed_node_whose_address_is_blocked_waits_the_block_out_to_come_back(caplog):
    settings = RunSettings(heartbeat_timeout=1.0, last_call=0.2, blocklist_after=1,
                           blocklist_cooldown=1.0)
    with Orchestrator("127.0.0.1", 0, settings=settings) as server:
        session, lost = _watching_session(server.endpoint, 2)
        try:
            session.client.heartbeat()  # it has beaten: silent from here on
            session.client.stop_heartbeats()
            deadline = time.monotonic() + 20
            with Client(server.endpoint, "job") as probe:
                while probe.status()[0].state == Phase.ACTIVE and time.monotonic() < deadline:
                    time.sleep(0.05)
            session._resume_heartbeats()
            while session.phase is not WorkerPhase.REMOVED and time.monotonic() < deadline:
                time.sleep(0.05)
            _reform(session)  # blocked for 1 s first
            assert "it waits to come back: address 127.0.0.1:20001" in caplog.text
            assert "and rejoined at generation" in caplog.text
        finally:
            session.close()
            session.client.close()


def test_a_node_tells_its_agent_its_id_and_each_generation(tmp_path):
    from tensorflow_elastic.membership import node_file

    path = str(tmp_path / "node")
    with Orchestrator("127.0.0.1", 0) as server:
        session = MembershipSession(Client(server.endpoint, "job"), "127.0.0.1:20001",
                                    NodeBounds(1, 2), node_file_path=path)
        try:
            session.start()
            assert node_file.read(path) == node_file.NodeRecord(session.node_id,
                                                                session.generation, 1)
            first = session.generation
            _reform(session)
            assert node_file.read(path).generation == session.generation > first
            assert not node_file.read(path).finished
            session.finish(3)
            # Whatever its exit does now, its agent counts it finished.
            assert node_file.read(path).finished
        finally:
            session.close()
            session.client.close()


def test_the_peer_check_waits_as_long_as_the_environment_says(monkeypatch):
    def session():
        return MembershipSession(_UnusedClient(), "127.0.0.1:1", NodeBounds(2, 4))

    assert session().watchdog.slow_after == PEER_CHECK_AFTER_S
    monkeypatch.setenv("TFE_PEER_CHECK_AFTER", "12.5")
    assert session().watchdog.slow_after == 12.5
    monkeypatch.setenv("TFE_PEER_CHECK_AFTER", "0")
    with pytest.raises(ValueError, match="TFE_PEER_CHECK_AFTER"):
        session()


def test_a_failure_to_act_on_a_generation_s_end_leaves_the_watch_running(caplog):
    session = _member_of_generation_7()
    lost = []

    def peers_lost(reason, live_from):
        lost.append(live_from)
        if len(lost) == 1:
            raise RuntimeError("a bug in the abort")

    session._on_peers_lost = peers_lost
    updates = [MembershipUpdate(Membership(None, generation, {0: "a"}, 0), Phase.ACTIVE, 0, "")
               for generation in (8, 9)]
    session.client.watch = lambda: iter(updates)
    session._watch()
    assert lost == [8, 9]  # the second end still aborted what was left
    assert "a bug in the abort" in caplog.text


class _JoinClient:
    """Records joins; a join returns generation 9 with nodes 0 and 1."""

    node_id = 0

    def __init__(self, watched):
        self.joins = []
        self.followed = []
        self.watched = watched

    def follow(self, membership):
        self.followed.append(membership.generation)

    def watch(self):
        return iter(self.watched)

    def join(self, address, min_nodes, max_nodes, timeout):
        self.joins.append(address)
        return Membership(0, 9, {0: "a", 1: "b"}, 0)


@pytest.mark.parametrize("watched_members, joins", [({0: "a", 2: "c"}, 0), ({2: "c"}, 1)])
def test_a_member_takes_a_watched_generation_it_belongs_to_without_joining(watched_members,
                                                                           joins):
    session = MembershipSession(_UnusedClient(), "127.0.0.1:1", NodeBounds(1, 4))
    session.client = _JoinClient([MembershipUpdate(Membership(None, 8, watched_members, 0),
                                                   Phase.ACTIVE, 0, "lost [1]")])
    session.membership = Membership(0, 7, {0: "a", 1: "b", 2: "c"}, 0)
    session.phases.move(WorkerPhase.MEMBER, "joined generation 7")
    session._on_peers_lost = lambda reason, live_from: None
    session._watch()
    membership = session.join_next_generation()
    assert len(session.client.joins) == joins
    # Its calls name the generation it follows.
    assert session.client.followed == ([8] if joins == 0 else [])
    # A member of the watched generation goes on in it; a node it left out joins.
    assert (membership.node_id, membership.generation) == (0, 8 if joins == 0 else 9)
    assert membership.rank == 0


def test_a_survivor_its_watch_told_of_the_next_generation_re_forms_without_a_join():
    settings = RunSettings(last_call=1.0)
    with Orchestrator("127.0.0.1", 0, settings=settings) as server, \
            Client(server.endpoint, "job") as other:
        lost = []
        session = MembershipSession(Client(server.endpoint, "job"), "127.0.0.1:20001",
                                    NodeBounds(1, 2),
                                    on_peers_lost=lambda reason, generation: lost.append(generation))
        joined = threading.Thread(target=other.join, args=("127.0.0.1:20002", 1, 2, 30.0))
        joined.start()
        try:
            session.start()
            joined.join(30)
            session.start_watching()
            assert session.membership.world_size == 2
            generation = session.generation
            other.report_death(other.node_id, "killed")
            deadline = time.monotonic() + 20
            while generation + 1 not in lost and time.monotonic() < deadline:
                time.sleep(0.02)
            joins = []
            join = session.client.join
            session.client.join = lambda *a, **k: joins.append(a) or join(*a, **k)
            membership = session.join_next_generation()
            assert joins == []
            assert (membership.generation, set(membership.members)) == (generation + 1,
                                                                          {session.node_id})
            # Its calls name the new generation: the barrier passes, the heartbeat is a member's.
            assert session.start_generation(membership, b"m") == {session.node_id: b"m"}
            assert session.client.heartbeat().member
        finally:
            session.close()
