"""A Keras 3 `fit` call goes on after its generation ended (a failed batch, a change voted at a
commit), in one process.

The runtime is the real one, between a fake session (test_loop.py) and a fake strategy; the
model trains under the default strategy. The model's train function fails as a collective
does when a peer is lost; the decisions behind it are tested on their own.
"""

from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_elastic as tfe
from tensorflow_elastic.training import plain_data
from tensorflow_elastic.strategy import cluster
from tensorflow_elastic.strategy import runtime as runtime_lib
from tensorflow_elastic.strategy.interrupts import CollectiveInterrupter
from tensorflow_elastic.training import fit_retry
from tests.training.test_loop import _Session

BATCHES = 5


class _Job(_Session):
    """The fake session, with the commits' reports and the state's exchange: this node alone,
    or at the `other_at`-th exchange with another member, whose message `other(this node's)`
    gives."""

    other_at = None
    exchanges = 0

    def report_step(self, commits):
        pass

    def start_generation(self, membership, message):
        return self.exchange("state", message)  # the barrier gathers the sync's messages

    def exchange(self, topic, value):
        self.exchanges += 1
        told = {self.node_id: value}
        if self.exchanges == self.other_at:
            told[9] = plain_data.encode(self.other(plain_data.decode(value)))
        return told


def _newcomer(mine):
    return {"values": mine["values"], "commits": 0, "job": {}}


def _member_outside_its_fit(mine):
    """At this node's commit, its failure in the sync that admits a newcomer, say."""
    return {**mine, "job": {**mine["job"], "in_step": False}}


def _member_ahead_in_its_fit(mine):
    """A member in its fit that had finished the failed batch: one commit further."""
    return {**mine, "commits": mine["commits"] + 1}


class _Vote:
    """The commits' vote: a change at the `change_at`-th commits."""

    def __init__(self):
        self.change_at, self.commits = set(), 0

    def read_tally(self):
        self.commits += 1
        return ()

    def outcome(self, tally):
        return self.commits in self.change_at


@pytest.fixture
def job(monkeypatch):
    session = _Job(standby=False)
    session.finish_step_together = lambda: None
    session.leave_requested = False
    session.vote = _Vote()
    rt = runtime_lib.ElasticRuntime(session, CollectiveInterrupter())
    rt.strategy = SimpleNamespace(num_replicas_in_sync=2, extended=SimpleNamespace(
        regroup=lambda members, generation: None, local_replica_count=1,
        take_replica_counts=lambda told: None, vote=session.vote))
    monkeypatch.setattr(runtime_lib, "current", lambda: rt)
    monkeypatch.setattr(cluster, "unreachable_peers", lambda members, node_id: [])
    return session


class _Batches(tf.keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.ended = []

    def on_train_batch_end(self, batch, logs=None):
        self.ended.append(batch)


def _model():
    model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
    model.compile(tf.keras.optimizers.SGD(0.1), "mse")
    model.make_train_function()
    return model


def _failing(model, at_calls, error=lambda: tf.errors.UnavailableError(None, None, "peer lost")):
    """Makes the model's train function fail at its `at_calls`-th calls; returns its calls."""
    function, calls = model.train_function, []

    def train_function(iterator):
        calls.append(len(calls) + 1)
        if len(calls) in at_calls:
            raise error()
        return function(iterator)

    model.train_function = train_function
    return calls


DATASET = tf.data.Dataset.from_tensor_slices(
    (np.ones((4 * BATCHES, 2), np.float32), np.ones((4 * BATCHES, 1), np.float32))).batch(4)


def _train(model, batches, fits, *callbacks):
    @tfe.run
    def train(state):
        fits.append(model.train_function)
        model.fit(DATASET, epochs=1, verbose=0,
                  callbacks=[tfe.keras.ElasticCallback(state), batches, *callbacks])
        return state.epoch, state.batch

    return train


def test_a_failed_batch_runs_again_in_the_same_fit_call(job):
    model, batches, fits = _model(), _Batches(), []
    calls = _failing(model, at_calls={3})
    plain = model.train_function
    assert _train(model, batches, fits)(tfe.State(epoch=0, batch=0)) == (1, 0)
    assert len(fits) == 1, "fit was entered again"
    assert batches.ended == list(range(BATCHES)) and len(calls) == BATCHES + 1
    assert job.reforms == 1 and model.train_function is plain


def _counting_resets(model):
    """Counts the model's metric resets (`fit` begins every epoch with one)."""
    resets = []
    reset = model.reset_metrics

    def counted():
        resets.append(len(resets))
        reset()

    model.reset_metrics = counted
    return resets


@pytest.mark.parametrize("other", [_newcomer, _member_outside_its_fit])
def test_the_fit_call_goes_on_while_a_member_that_did_not_recover_inside_its_fit_begins_one(
        job, other):
    """Its `fit` begins next, with collectives of its own (the metrics' reset): this member
    runs them too, then the failed batch again, in the same call."""
    model, batches, fits = _model(), _Batches(), []
    calls = _failing(model, at_calls={3})
    resets = _counting_resets(model)
    job.other_at, job.other = 2, other  # the first sync is the job's start, then the recovery's
    assert _train(model, batches, fits)(tfe.State(epoch=0, batch=0)) == (1, 0)
    assert len(fits) == 1, "fit was entered again"
    assert batches.ended == list(range(BATCHES)) and len(calls) == BATCHES + 1
    assert len(resets) == 2, "the epoch's reset, then the one a beginning fit call runs"


def test_a_failure_in_the_collectives_of_a_beginning_fit_is_recovered_from_in_the_same_call(
        job):
    """The metrics' reset this member runs with a newcomer's `fit` start fails (a member was
    lost meanwhile): it recovers again and goes on in the same call."""
    model, batches, fits = _model(), _Batches(), []
    calls = _failing(model, at_calls={3})
    resets = _counting_resets(model)
    reset = model.reset_metrics

    def failing_once():
        reset()
        if len(resets) == 2:
            raise tf.errors.UnavailableError(None, None, "a member lost in the reset")

    model.reset_metrics = failing_once
    job.other_at, job.other = 2, _newcomer
    assert _train(model, batches, fits)(tfe.State(epoch=0, batch=0)) == (1, 0)
    assert len(fits) == 1, "fit was entered again"
    assert batches.ended == list(range(BATCHES)) and len(calls) == BATCHES + 1
    assert job.reforms == 2 and len(resets) == 2


def test_every_member_enters_fit_again_when_the_members_in_their_fit_were_at_different_commits(
        job):
    model, batches, fits = _model(), _Batches(), []
    _failing(model, at_calls={3})
    plain = model.train_function
    job.other_at, job.other = 2, _member_ahead_in_its_fit
    assert _train(model, batches, fits)(tfe.State(epoch=0, batch=0)) == (1, 0)
    assert fits == [plain, plain] and model.train_function is plain
    # Batches 0 and 1 in the first fit, the resumed epoch's rest (numbered from 0) in the next.
    assert batches.ended == [0, 1, 0, 1, 2]


@pytest.mark.parametrize("other", [None, _newcomer])
def test_a_change_voted_at_a_commit_is_taken_in_the_same_fit_call(job, other):
    """A node joins (or leaves) at the commit after batch 1: the members finish the step
    together, re-form and sync before batch 2, which runs in the same call (after the fit
    start's collectives when a newcomer begins its call); the other callbacks saw batch 1
    end in the generation that trained it."""
    model, batches, fits = _model(), _Batches(), []
    calls = _failing(model, at_calls=set())
    resets = _counting_resets(model)
    job.vote.change_at = {2}
    if other is not None:
        job.other_at, job.other = 2, other
    generations = []

    class Generation(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            generations.append(job.reforms)

    assert _train(model, batches, fits, Generation())(tfe.State(epoch=0, batch=0)) == (1, 0)
    assert len(fits) == 1, "fit was entered again"
    assert batches.ended == list(range(BATCHES)) and len(calls) == BATCHES
    assert generations == [0, 0, 1, 1, 1] and job.reforms == 1
    assert len(resets) == (2 if other else 1)


def test_a_change_voted_at_the_last_commit_of_a_fit_call_enters_fit_again(job):
    """A callback stops the training at batch 1, whose commit the members voted at: the loop
    takes the change (re-form, sync) and `fit` begins again from batch 2."""
    model, batches, fits = _model(), _Batches(), []

    class StopOnce(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if not self.model.stop_training and len(fits) == 1 and batch == 1:
                self.model.stop_training = True

    job.vote.change_at = {2}
    assert _train(model, batches, fits, StopOnce())(tfe.State(epoch=0, batch=0)) == (1, 0)
    assert len(fits) == 2 and job.reforms == 1
    assert batches.ended == [0, 1, 0, 1, 2]


@pytest.mark.parametrize("where", ["in the train function", "in a callback"])
def test_a_fit_that_ends_in_an_error_leaves_the_plain_train_function(job, where):
    model, batches, fits = _model(), _Batches(), []

    class Raises(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                raise KeyError("a callback's own error")

    if where == "in the train function":
        _failing(model, at_calls={3}, error=lambda: ValueError("the user's own error"))
        callbacks, expected = (), ValueError
    else:
        callbacks, expected = (Raises(),), KeyError
    plain = model.train_function
    with pytest.raises(expected):
        _train(model, batches, fits, *callbacks)(tfe.State(epoch=0, batch=0))
    assert model.train_function is plain and job.reforms == 0


def test_outside_the_elastic_loop_a_failed_batch_ends_fit(job):
    model = _model()
    _failing(model, at_calls={2})
    plain = model.train_function
    state = tfe.State(epoch=0, batch=0)
    state.bind(runtime_lib.current())
    with pytest.raises(tf.errors.UnavailableError):
        model.fit(DATASET, epochs=1, verbose=0, callbacks=[tfe.keras.ElasticCallback(state)])
    assert model.train_function is plain and job.reforms == 0


@pytest.mark.parametrize("keras_3, one_trace, in_run, commit_every, snapshot_every, retries", [
    (True, True, True, 1, 1, True),
    (False, False, True, 1, 1, False),   # tf-keras: traced per world size
    (True, False, True, 1, 1, False),    # a Keras 3 whose losses could not be scaled at run time
    (True, True, False, 1, 1, False),    # fit outside tfe.run: nobody re-forms
    (True, True, True, 2, 1, False),     # members may be a batch apart at the same commit
    (True, True, True, 1, 2, False),     # a restore goes back further than the batch
])
def test_when_a_failed_batch_runs_again_inside_fit(keras_3, one_trace, in_run, commit_every,
                                                   snapshot_every, retries):
    assert fit_retry.retries_in_fit(keras_3, one_trace, in_run, commit_every,
                                    snapshot_every) is retries


@pytest.mark.parametrize("beginning_fit, synced, start, synced_to, one_device_each, how", [
    ((), (), (2, 5), (2, 5), True, fit_retry.GoOn(with_new_fits=False)),
    ((), (), (2, 5), (2, 5), False, fit_retry.GoOn(with_new_fits=False)),
    # A newcomer (synced) or a member that failed outside its fit begins its fit call.
    ((4,), (4,), (2, 5), (2, 5), True, fit_retry.GoOn(with_new_fits=True)),
    ((4,), (), (2, 5), (2, 5), True, fit_retry.GoOn(with_new_fits=True)),
    ((4,), (4,), (2, 5), (2, 5), False, None),   # its fit reduces its first batch
    ((), (3,), (2, 5), (2, 5), True, None),   # a member in its fit had finished the batch
    ((4,), (3, 4), (2, 5), (2, 5), True, None),
    ((), (), (2, 5), (2, 4), True, None),
])
def test_after_the_recovery_the_fit_call_goes_on_only_where_every_member_can(
        beginning_fit, synced, start, synced_to, one_device_each, how):
    decided = fit_retry.after_recovery(frozenset(beginning_fit), frozenset(synced), start,
                                       synced_to, one_device_each)
    if how is None:
        assert isinstance(decided, str)
    else:
        assert decided == how
