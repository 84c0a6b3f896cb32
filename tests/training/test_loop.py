"""`tensorflow_elastic.run` in one process: what a state sync failing with a mismatch leads to,
and the decision table behind it.

A fake session stands in for the orchestrator and a fake strategy for TensorFlow's cluster;
the runtime between them is the real one. The state's sync raises the error a collective
raises when a newcomer's state does not fit the members'.
"""

from types import SimpleNamespace

import pytest
import tensorflow as tf

import tensorflow_elastic as tfe
from tensorflow_elastic.errors import (ElasticJobFailed, GenerationEnded, MembershipChanged,
                                       StateLayoutMismatch)
from tensorflow_elastic.membership.node_file import Progress
from tensorflow_elastic.strategy import cluster
from tensorflow_elastic.strategy import runtime as runtime_lib
from tensorflow_elastic.strategy.interrupts import CollectiveInterrupter
from tensorflow_elastic.strategy.decision import Action, Situation, decide


class _Session:
    def __init__(self, standby: bool, moved_on: bool = False):
        self.standby = standby
        self._moved_on = moved_on
        self.node_id = 2
        self.generation = 3
        self.membership = SimpleNamespace(chief_id=1, members={1: "a", 2: "b"}, generation=3,
                                          world_size=2, is_chief=False)
        self.events = SimpleNamespace(record=lambda *args, **kwargs: None)
        self.left: list[str] = []
        self.reforms = 0
        self.progress = Progress()

    job_failed = ""

    def tell_agent(self):
        pass

    def check_job_alive(self):
        if self.job_failed:
            raise ElasticJobFailed(self.job_failed)

    def moved_on(self):
        return self._moved_on

    reported = 0

    def report_failure(self, peers, reason, detail):
        self.reported += 1

    def join_next_generation(self):
        if self.standby:
            self.standby = False  # a newcomer's entry, not a re-form
        else:
            self.reforms += 1
        return self.membership

    def start_generation(self, membership, message):
        return {self.node_id: message}

    def finish(self, commits):
        pass

    def leave(self, reason):
        self.left.append(reason)


# How TensorFlow fails a collective whose members differ: in shape, in dtype.
MISMATCHES = [tf.errors.InvalidArgumentError, tf.errors.InternalError]


class _MismatchOnce(tfe.State):
    """A state whose first `failures` syncs fail as the broadcast does when the members'
    tensors differ."""

    error = tf.errors.InvalidArgumentError
    failures = 1

    def sync(self):
        failed = getattr(self, "failed", 0)
        if failed < self.failures:
            object.__setattr__(self, "failed", failed + 1)
            raise self.error(None, None, self.message)
        # Later syncs: the members alone, in step (nothing to take).


# What a member resolving its group gets from a source that a differing newcomer aborted.
ANOTHER_GROUPS_MISMATCH = (
    "Collective ops is aborted by: Shape mismatch in the collective instance 1073741825.\n"
    "Additional GRPC error information from remote target /job:worker/replica:0/task:1 "
    "while calling /tensorflow.WorkerService/CompleteGroup:")


def _run(monkeypatch, standby: bool, commits: int, error=tf.errors.InvalidArgumentError,
         moved_on: bool = False, failures: int = 1,
         message: str = "Collective instance 1073741825 differs", train=lambda state: "trained"):
    session = _Session(standby, moved_on)
    rt = runtime_lib.ElasticRuntime(session, CollectiveInterrupter())
    rt.strategy = SimpleNamespace(extended=SimpleNamespace(regroup=lambda members, gen: None,
                                                          local_replica_count=1,
                                                          take_replica_counts=lambda told: None))
    monkeypatch.setattr(runtime_lib, "current", lambda: rt)
    monkeypatch.setattr(cluster, "unreachable_peers", lambda members, node_id: [])
    state = _MismatchOnce(step=0)
    object.__setattr__(state, "error", error)
    object.__setattr__(state, "failures", failures)
    object.__setattr__(state, "message", message)
    object.__setattr__(state, "_commits", commits)
    object.__setattr__(state, "_saved_commits", commits)
    return session, state, tfe.run(train)


@pytest.mark.parametrize("error", MISMATCHES)
def test_members_re_form_when_a_newcomer_breaks_their_sync(monkeypatch, error):
    session, state, train = _run(monkeypatch, standby=False, commits=5, error=error)
    assert train(state) == "trained"
    assert session.reforms == 1 and session.left == []


@pytest.mark.parametrize("error", MISMATCHES)
def test_a_newcomer_whose_sync_fails_leaves_saying_why(monkeypatch, error):
    session, state, train = _run(monkeypatch, standby=True, commits=0, error=error)
    with pytest.raises(StateLayoutMismatch, match="could not be synced from the members'"):
        train(state)
    assert len(session.left) == 1 and session.left[0].startswith("state sync failed")
    assert session.reforms == 0


def test_a_mismatch_at_the_start_of_a_job_is_a_bug_to_fix(monkeypatch):
    session, state, train = _run(monkeypatch, standby=False, commits=0)
    with pytest.raises(tf.errors.InvalidArgumentError):
        train(state)
    assert session.left == [] and session.reforms == 0


def test_a_newcomer_whose_sync_fails_after_the_generation_ended_re_forms(monkeypatch):
    """The end of the generation, not this node's state, may be what failed its transfer."""
    session, state, train = _run(monkeypatch, standby=True, commits=0, moved_on=True)
    assert train(state) == "trained"
    assert session.left == [] and session.reforms == 1


def test_a_newcomer_that_gets_another_newcomer_s_mismatch_re_forms(monkeypatch):
    """Its turn in the sync never came: the source's abort reached it while it resolved its
    group with the source."""
    session, state, train = _run(monkeypatch, standby=True, commits=0,
                                 message=ANOTHER_GROUPS_MISMATCH)
    assert train(state) == "trained"
    assert session.left == [] and session.reforms == 1


def test_a_member_whose_step_gets_another_groups_mismatch_re_forms(monkeypatch):
    """A member outside a growth's sync goes on to its step while the source syncs a newcomer
    whose state differs; the source's abort reaches it as its step resolves its group."""
    steps = []

    def train(state):
        steps.append(len(steps))
        if len(steps) == 1:
            raise tf.errors.InvalidArgumentError(None, None, ANOTHER_GROUPS_MISMATCH)
        return "trained"

    session, state, train = _run(monkeypatch, standby=False, commits=5, failures=0, train=train)
    assert train(state) == "trained"
    assert steps == [0, 1] and session.left == [] and session.reforms == 1


def test_a_recovery_is_counted_for_the_agent_with_its_duration_and_lost_step(monkeypatch):
    """What the node file tells the agent (its metrics): one recovery, the step in flight lost."""
    def train(state):
        if session.reforms == 0:
            raise tf.errors.UnavailableError(None, None, "peer lost")
        return "trained"

    session, state, train = _run(monkeypatch, standby=False, commits=5, failures=0, train=train)
    assert train(state) == "trained"
    assert (session.progress.recoveries, session.progress.lost_steps) == (1, 1)
    assert len(session.progress.recovery_seconds) == 1


def test_a_mismatch_in_a_step_is_not_re_formed_around(monkeypatch):
    """Members whose step tensors differ have a bug that no re-form repairs."""
    def train(state):
        raise tf.errors.InvalidArgumentError(None, None, "Shape mismatch in the collective "
                                             "instance 105")

    session, state, train = _run(monkeypatch, standby=False, commits=5, failures=0, train=train)
    with pytest.raises(tf.errors.InvalidArgumentError):
        train(state)
    assert session.reforms == 0


def test_re_forms_that_never_get_to_commit_end_the_job_with_the_last_failure(monkeypatch):
    session, state, train = _run(monkeypatch, standby=False, commits=5,
                                 error=tf.errors.InternalError, failures=100)
    with pytest.raises(tfe.ElasticJobFailed, match="without a single commit") as failed:
        train(state)
    assert isinstance(failed.value.__cause__, tf.errors.InternalError)
    assert session.reforms == runtime_lib.MAX_REFORMS_WITHOUT_PROGRESS


def _error(kind, message="Collective instance 105 differs"):
    return kind(None, None, message)


MEMBER, NEWCOMER = False, True
IN_STEP, IN_SYNC = True, False
NEVER_ASKED = None


@pytest.mark.parametrize("error, in_step, newcomer, commits, moved_on, action", [
    (MembershipChanged("vote"), IN_STEP, MEMBER, 5, NEVER_ASKED, Action.CHANGE),
    (ElasticJobFailed("the orchestrator ended the run"), IN_STEP, MEMBER, 5, NEVER_ASKED,
     Action.RAISE),
    (StateLayoutMismatch("differs"), IN_SYNC, NEWCOMER, 0, NEVER_ASKED, Action.LEAVE),
    (GenerationEnded("lost"), IN_SYNC, MEMBER, 5, NEVER_ASKED, Action.RESYNC),
    (GenerationEnded("lost"), IN_STEP, MEMBER, 5, NEVER_ASKED, Action.RAISE),
    # A lost peer, in a step or in the sync.
    (_error(tf.errors.UnavailableError), IN_STEP, MEMBER, 5, NEVER_ASKED, Action.RECOVER),
    (_error(tf.errors.CancelledError), IN_SYNC, MEMBER, 5, NEVER_ASKED, Action.RECOVER),
    # A newcomer whose state does not fit, unless the generation ended or the mismatch was
    # another newcomer's.
    (_error(tf.errors.InvalidArgumentError), IN_SYNC, NEWCOMER, 0, False, Action.LEAVE),
    (_error(tf.errors.InvalidArgumentError), IN_SYNC, NEWCOMER, 0, True, Action.RECOVER),
    (_error(tf.errors.InvalidArgumentError, ANOTHER_GROUPS_MISMATCH), IN_SYNC, NEWCOMER, 0,
     NEVER_ASKED, Action.RECOVER),
    # Members whose sync a newcomer broke; at a job's start the same is a bug.
    (_error(tf.errors.InvalidArgumentError), IN_SYNC, MEMBER, 5, False, Action.RECOVER),
    (_error(tf.errors.InvalidArgumentError), IN_SYNC, MEMBER, 0, False, Action.RAISE),
    # In a step: a mismatch is the training code's, unless passed on from another group.
    (_error(tf.errors.InvalidArgumentError), IN_STEP, MEMBER, 5, False, Action.RAISE),
    (_error(tf.errors.InvalidArgumentError), IN_STEP, MEMBER, 5, True, Action.RECOVER),
    (_error(tf.errors.InvalidArgumentError, ANOTHER_GROUPS_MISMATCH), IN_STEP, MEMBER, 5,
     NEVER_ASKED, Action.RECOVER),
    # The user's own errors.
    (ValueError("bad input"), IN_STEP, MEMBER, 5, False, Action.RAISE),
    (ZeroDivisionError(), IN_STEP, NEWCOMER, 0, False, Action.RAISE),
])
def test_what_the_loop_does_about_an_error(error, in_step, newcomer, commits, moved_on, action):
    def asked():
        assert moved_on is not NEVER_ASKED, "the error alone decides: no call to the orchestrator"
        return moved_on

    assert decide(error, Situation(in_step, newcomer, commits), asked) is action


def test_a_job_that_fails_while_a_member_recovers_ends_with_that_reason_at_once(monkeypatch):
    def train(state):
        session.job_failed = "the orchestrator ended the run"
        raise tf.errors.UnavailableError(None, None, "peer gone")

    session, state, train = _run(monkeypatch, standby=False, commits=5, failures=0, train=train)
    with pytest.raises(ElasticJobFailed, match="the orchestrator ended the run"):
        train(state)
    assert session.reforms == 0 and session.reported == 0


def test_every_failure_is_reported_and_restored_before_the_job_gives_up(monkeypatch):
    session, state, train = _run(monkeypatch, standby=False, commits=5,
                                 error=tf.errors.InternalError, failures=100)
    with pytest.raises(ElasticJobFailed, match="without a single commit"):
        train(state)
    assert session.reported == runtime_lib.MAX_REFORMS_WITHOUT_PROGRESS + 1


def test_the_bytes_of_a_state_sync_are_counted_for_the_agent():
    session = _Session(standby=False)
    rt = runtime_lib.ElasticRuntime(session, CollectiveInterrupter())
    rt.record("state_synced", source=1, receivers=[2], bytes=4096, seconds=0.1)
    rt.record("step", step=3)
    assert session.progress.sync_bytes == 4096


def _syncs(state) -> int:
    return getattr(state, "failed", 0)


def test_a_step_that_recovers_inside_itself_goes_on_in_place(monkeypatch):
    """Keras `fit`'s batch: the loop's recovery (restore, re-form, sync) without leaving the
    step, which is called once."""
    steps = []

    def train(state):
        steps.append(len(steps))
        state.step = 7  # a step lost with the generation
        runtime_lib.current().recover_in_step(state, tf.errors.UnavailableError(None, None, "x"))
        assert state.step == 0, "the state went back to the last commit"
        return "trained"

    session, state, train = _run(monkeypatch, standby=False, commits=5, failures=0, train=train)
    assert train(state) == "trained"
    assert steps == [0] and session.reforms == 1 and session.reported == 1
    assert (session.progress.recoveries, session.progress.lost_steps) == (1, 8)


def test_a_step_that_cannot_go_on_after_its_recovery_starts_again_without_a_second_sync(
        monkeypatch):
    steps, synced = [], []
    monkeypatch.setattr(runtime_lib.ElasticRuntime, "sync",
                        lambda self, state: synced.append(len(steps)))

    def train(state):
        steps.append(len(steps))
        if len(steps) == 1:
            runtime_lib.current().recover_in_step(state, tf.errors.AbortedError(None, None, "x"))
            raise runtime_lib.StepRestarts("a newcomer joined")
        return "trained"

    session, state, train = _run(monkeypatch, standby=False, commits=5, failures=0, train=train)
    assert train(state) == "trained"
    assert steps == [0, 1] and synced == [0, 1] and session.reforms == 1


def test_what_a_recovery_inside_the_step_decided_is_not_decided_again(monkeypatch):
    """A node whose state does not fit leaves once, and its error ends the loop as it is."""
    def train(state):
        runtime_lib.current().recover_in_step(state, StateLayoutMismatch("an extra variable"))

    session, state, train = _run(monkeypatch, standby=False, commits=5, failures=0, train=train)
    with pytest.raises(StateLayoutMismatch, match="an extra variable"):
        train(state)
    assert len(session.left) == 1 and session.reforms == 0
    assert not runtime_lib.current().training
