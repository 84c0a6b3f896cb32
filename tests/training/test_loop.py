"""`tensorflow_elastic.run` in one process: what a state sync failing with a mismatch leads to.

A fake session stands in for the orchestrator; the state's sync raises the
error a collective raises when a newcomer's state does not fit the members'.
"""

from types import SimpleNamespace

import pytest
import tensorflow as tf

import tensorflow_elastic as tfe
from tensorflow_elastic.errors import StateLayoutMismatch
from tensorflow_elastic.strategy import runtime as runtime_lib
from tensorflow_elastic.training import loop


class _Session:
    def __init__(self, standby: bool, moved_on: bool = False):
        self.standby = standby
        self._moved_on = moved_on
        self.node_id = 2
        self.generation = 3
        self.membership = SimpleNamespace(chief_id=1, members={1: "a", 2: "b"}, generation=3,
                                          world_size=2)
        self.events = SimpleNamespace(record=lambda *args, **kwargs: None)
        self.left: list[str] = []
        self.reforms = 0

    def enter_training(self):
        pass

    def check_job_alive(self):
        pass

    def moved_on(self):
        return self._moved_on

    def reform(self):
        self.reforms += 1

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
    failures_reported = []
    monkeypatch.setattr(runtime_lib, "current", lambda: SimpleNamespace(
        session=session, report_failure=failures_reported.append))
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
    assert session.reforms == loop.MAX_REFORMS_WITHOUT_PROGRESS
