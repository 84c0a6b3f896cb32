"""State objects in one process: snapshots, rollback, uncommitted steps, reset callbacks.

Commit's vote and a real sync need a cluster; tests/strategy covers them with
real workers. Here a stand-in job (what the runtime hands a State) plays the
members a sync gathers.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_elastic as tfe
from tensorflow_elastic.observability import events
from tensorflow_elastic.observability.events import EventLog, read_events
from tensorflow_elastic.errors import (ElasticJobFailed, GenerationEnded, NoCommittedState,
                                       StateLayoutMismatch)
from tensorflow_elastic.training import layouts as layouts_lib
from tensorflow_elastic.training import plain_data
from tensorflow_elastic.training.state import furthest_ahead, needing_state


def test_attributes_roll_back_to_the_last_save():
    state = tfe.State(epoch=0, batch=0, history=[])
    state.batch = 3
    state.history.append("a")
    state.save()
    state.batch = 7
    state.epoch = 1
    state.history.append("b")
    state.restore()
    assert (state.epoch, state.batch, state.history) == (0, 3, ["a"])


def test_object_state_is_the_python_attribute_state():
    assert tfe.ObjectState is tfe.State


def test_saved_values_are_copies():
    state = tfe.State(history=[1])
    state.history.append(2)
    state.restore()
    assert state.history == [1]


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError):
        tfe.State(step=0).missing


@pytest.mark.parametrize("name", ["step", "batch"])
def test_uncommitted_steps_counts_progress_since_the_save(name):
    state = tfe.State(**{name: 5})
    setattr(state, name, 8)
    assert state.uncommitted_steps() == 3
    state.save()
    assert state.uncommitted_steps() == 0


def test_uncommitted_steps_without_a_counter_is_zero():
    assert tfe.State(epoch=1).uncommitted_steps() == 0


def test_reset_callbacks_run_in_order():
    calls = []
    state = tfe.State()
    state.register_reset_callbacks([lambda: calls.append(1), lambda: calls.append(2)])
    state.on_reset()
    state.on_reset()
    assert calls == [1, 2, 1, 2]


def test_tensorflow_state_restores_variables_after_updates():
    weights = tf.Variable([1.0, 2.0])
    counter = tf.Variable(3, dtype=tf.int64)
    state = tfe.TensorFlowState([weights, counter], step=0)
    weights.assign_add([10.0, 10.0])
    counter.assign(9)
    state.step = 1
    state.save()
    weights.assign([0.0, 0.0])
    counter.assign(0)
    state.step = 2
    state.restore()
    assert weights.numpy().tolist() == [11.0, 12.0]
    assert int(counter.numpy()) == 9
    assert state.step == 1


def test_a_snapshot_is_not_changed_by_later_in_place_updates():
    weights = tf.Variable(tf.ones([64]))
    state = tfe.TensorFlowState([weights])
    for _ in range(3):
        weights.assign_sub(tf.ones([64]))
    state.restore()
    assert float(tf.reduce_sum(weights)) == 64.0


def test_sync_source_is_the_member_with_the_most_commits():
    # A survivor whose step finished before a crash has one commit more: it is
    # the source, so the others do not redo that step.
    assert furthest_ahead({1: 40, 2: 41, 3: 40}) == 2


def test_sync_source_among_even_members_is_the_lowest_id():
    assert furthest_ahead({3: 40, 2: 40, 5: 40}) == 2


def test_newcomer_without_commits_is_never_the_sync_source():
    assert furthest_ahead({0: 0, 4: 12, 7: 12}) == 4


def test_a_dirty_member_loses_to_a_clean_one_at_its_commit_and_always_receives():
    # Node 2's step failed after it had written variables its commit does not hold.
    assert furthest_ahead({1: 40, 2: 40, 3: 40}, dirty={1}) == 2
    assert furthest_ahead({1: 40, 2: 41, 3: 41}, dirty={2}) == 3
    assert needing_state({1: 40, 2: 40, 3: 40}, source=1, dirty={2}) == [2]


def test_no_clean_member_at_the_last_commit_fails_instead_of_going_back():
    # Node 2 alone holds commit 41's count, but not its variables: the others' commit 40 is
    # older; taking it would redo a committed step unnoticed.
    with pytest.raises(NoCommittedState, match="no member holds the job's last commit"):
        furthest_ahead({1: 40, 2: 41, 3: 40}, dirty={2})
    # Newcomers (no commits, clean) never stand in for dirty trained members.
    with pytest.raises(NoCommittedState):
        furthest_ahead({0: 12, 1: 12, 5: 0, 6: 0}, dirty={0, 1})
    assert issubclass(NoCommittedState, ElasticJobFailed)


def test_a_newcomer_is_the_source_only_before_the_first_commit():
    assert furthest_ahead({3: 0, 5: 0}) == 3
    assert furthest_ahead({0: 3, 5: 0, 6: 0}) == 0


def test_a_node_joining_a_running_job_is_never_the_source():
    # Before the first commit too: the trained member's values are the job's.
    assert furthest_ahead({4: 0, 1: 0}, joining={1}) == 4
    # The members that held the job's state finished or were lost: the newcomers must not
    # start the job afresh from one of theirs.
    with pytest.raises(NoCommittedState, match="came to join the running job"):
        furthest_ahead({3: 0, 5: 0, 6: 0}, joining={3, 5, 6})


def test_a_newcomer_tells_it_is_joining_until_its_first_sync():
    seen = []

    def exchange(topic, blob):
        seen.append(plain_data.decode(blob).get("joining"))
        return {1: blob, 0: _state({"step": 0}, 4, like=blob)}

    state = tfe.State(step=0)
    state.bind(_Job(exchange))
    state.prepare_to_join()
    state.sync()
    state.sync()
    assert seen == [True, None] and state.commits == 4


class _Order:
    """A stand-in for the strategy's StepOrder: the variables with handles in `ordered` are
    ordered; `runs` counts the steps applied."""

    def __init__(self, ordered):
        self.ordered, self.runs, self.version, self.all_unordered = set(ordered), 0.0, 0, False

    def is_ordered(self, handles):
        return not self.all_unordered and all(h in self.ordered for h in handles)

    def read_applied(self):
        return (self.runs,)

    def runs_between(self, before, now):
        pass

    def hold_everything(self):
        self.all_unordered, self.version = True, self.version + 1

    def listen(self, callback):
        pass


def _handle(variable):
    from tensorflow.python.framework import ops
    return ops.tensor_id(variable.handle)


def test_a_commit_holds_only_the_unordered_variables_and_a_restore_leaves_the_others():
    weights, moving = tf.Variable(1.0), tf.Variable(1.0)
    order = _Order({_handle(weights)})
    state = tfe.TensorFlowState([weights, moving], step=0)
    state.bind(_Job(order=order))
    state.commit()
    assert state._held == [moving]
    # A failed step wrote nothing ordered (its writes wait for its collectives).
    moving.assign(5.0)
    state.step += 1
    state.restore()
    assert (state.step, weights.numpy(), moving.numpy()) == (0, 1.0, 1.0)
    assert not state._dirty


def test_a_member_whose_steps_ran_since_its_commit_is_dirty_and_takes_another_s_state():
    weights = tf.Variable(1.0)
    order = _Order({_handle(weights)})
    state = tfe.TensorFlowState([weights], step=0)
    others = {0: ({"step": 0}, 1)}

    def exchange(topic, blob):
        return {1: blob, **{node: _state(*message, like=blob) for node, message in others.items()}}

    state.bind(_Job(exchange, _receive([1.0]), order=order))
    state.commit()
    # Two step calls between two commits: the first applied, the second failed.
    weights.assign(2.0)
    order.runs += 1
    state.restore()
    assert state._dirty and order.all_unordered
    state.sync()
    assert (weights.numpy(), state._dirty) == (1.0, False)
    # Every member dirty: nobody holds a committed state.
    state._dirty = True
    others.clear()
    with pytest.raises(NoCommittedState, match="no member holds the job's last commit"):
        state.sync()


def _state(values, commits, like=None, layout=None):
    """What a member exchanges at a sync: its Python values and commits, its job's facts (none
    here), and the digest of its state layout: `layout`'s, or the one in `like` (another
    member's message: the same layout)."""
    message = {"values": values, "commits": commits, "job": {}}
    if layout is not None:
        message["layout"] = layouts_lib.digest(layout)
    elif like is not None and "layout" in plain_data.decode(like):
        message["layout"] = plain_data.decode(like)["layout"]
    return plain_data.encode(message)


class _Job:
    """What a State is handed in place of the runtime (training.state.Job): node 1 of
    generation 2, alone unless `exchange` says otherwise; a commit never changes the
    membership."""

    node_id = 1

    def __init__(self, exchange=None, broadcast=None, events_file=None, prepare=None,
                 generation=2, order=None):
        self.exchange = exchange or (lambda topic, blob: {1: blob})
        self.order = order
        self.broadcast_variables = broadcast
        self.prepare_to_sync = prepare
        self.generation = generation
        self.events = EventLog(events_file and str(events_file))

    def commit(self, state):
        state.count_commit(lambda: (0.0, 1.0))

    def record(self, event, **fields):
        self.events.record(event, node=self.node_id, generation=self.generation, **fields)

    def snapshot_extras(self):
        return None, []

    def step_order(self):
        return self.order

    def sync_facts(self):
        return {}

    def gathered_at_start(self):
        return None

    def take_sync_facts(self, facts):
        pass


def _members_ahead(state, broadcast, events_file=None, layouts=None):
    """Node 1 syncs with node 0, which is at step 7 after 7 commits; `broadcast(variables,
    source, receivers)` stands in for the collectives that give the variables node 0's values.
    `layouts` (node -> layout) replaces the members' state layouts (default: all equal to node
    1's)."""
    layouts = layouts or {}

    def exchange(topic, blob):
        if topic == "state":
            # Members other than 0 and 1 are newcomers.
            return {0: _state({"step": 7}, 7, like=blob, layout=layouts.get(0)), 1: blob,
                    **{node: _state({"step": 0}, 0, layout=layout)
                       for node, layout in layouts.items() if node > 1}}
        message = layouts_lib.digest if topic == "layout" else layouts_lib.detail
        shared = {0: blob, 1: blob}
        shared.update({node: message(layout) for node, layout in layouts.items()})
        return shared

    state.bind(_Job(exchange, broadcast, events_file))


def _receive(values):
    """A broadcast in which node 1 receives `values`."""

    def broadcast(variables, source, receivers, one_group):
        # A node behind the members: each receiver apart (it may be a newcomer at fault).
        assert (source, receivers, one_group) == (0, [1], False)
        for variable, value in zip(variables, values):
            variable.assign(value)

    return broadcast


def test_a_sync_records_what_it_moved_and_how_long_it_took(tmp_path):
    weights, counts = tf.Variable([1.0, 2.0]), tf.Variable([3], dtype=tf.int64)
    state = tfe.TensorFlowState([weights, counts], step=3)
    _members_ahead(state, _receive([[5.0, 6.0], [9]]), tmp_path / "events.jsonl")
    state.sync()
    [synced] = read_events(str(tmp_path / "events.jsonl"), event=events.STATE_SYNCED)
    assert (synced["node"], synced["generation"], synced["source"]) == (1, 2, 0)
    assert synced["bytes"] == 2 * 4 + 8
    assert synced["seconds"] >= 0


def test_a_sync_with_equal_layouts_gathers_the_members_in_one_exchange():
    weights = tf.Variable([1.0])
    state = tfe.TensorFlowState([weights], step=3)
    topics = []

    def exchange(topic, blob):
        topics.append(topic)
        return {0: _state({"step": 7}, 7, like=blob), 1: blob}

    state.bind(_Job(exchange, _receive([[5.0]])))
    state.sync()
    # The layouts' digests travel with the values: every member waits for one gather only.
    assert topics == ["state"]
    assert weights.numpy().tolist() == [5.0]


def test_the_jobs_facts_travel_with_the_state_in_its_one_exchange():
    state = tfe.State(step=3)
    topics, taken = [], []

    def exchange(topic, blob):
        topics.append(topic)
        other = plain_data.decode(_state({"step": 7}, 7))
        other["job"] = {"replicas": 2}
        return {0: plain_data.encode(other), 1: blob}

    job = _Job(exchange)
    job.sync_facts = lambda: {"replicas": 1}
    job.take_sync_facts = taken.append
    state.bind(job)
    state.sync()
    # The members' replica counts size the generation's collectives: one gather for both.
    assert topics == ["state"]
    assert taken == [{0: {"replicas": 2}, 1: {"replicas": 1}}]
    assert state.step == 7


def test_sync_takes_the_values_and_variables_of_the_member_ahead():
    weights = tf.Variable([1.0])
    state = tfe.TensorFlowState([weights], step=3)
    _members_ahead(state, _receive([[5.0]]))
    state.sync()
    assert (state.step, state.commits, weights.numpy().tolist()) == (7, 7, [5.0])
    weights.assign([0.0])
    state.restore()
    assert weights.numpy().tolist() == [5.0]


def test_a_sync_that_fails_in_the_broadcast_is_undone_by_the_restore():
    weights = tf.Variable([1.0])
    state = tfe.TensorFlowState([weights], step=3)

    def peer_lost(variables, source, receivers, one_group):
        variables[0].assign([5.0])  # received before the peer was lost
        raise tf.errors.UnavailableError(None, None, "peer lost")

    _members_ahead(state, peer_lost)
    with pytest.raises(tf.errors.UnavailableError):
        state.sync()
    state.restore()
    # Taking node 0's step without its variables would skip a step's samples.
    assert (state.step, state.commits, weights.numpy().tolist()) == (3, 0, [1.0])


def test_members_in_step_need_no_broadcast():
    assert needing_state({1: 40, 2: 40, 5: 40}, source=1) == []


@pytest.mark.parametrize("commits, source, receivers", [
    ({1: 40, 2: 41}, 2, [1]),                   # apart after a crash
    ({0: 0, 4: 12, 7: 12}, 4, [0]),             # a newcomer: only it receives
    ({0: 0, 1: 0, 2: 0}, 0, [1, 2]),            # a fresh start: initial values may differ
    ({1: 40, 2: 41, 3: 41, 9: 0}, 2, [1, 9]),   # apart and a newcomer
])
def test_members_apart_a_newcomer_or_a_fresh_start_receive(commits, source, receivers):
    assert needing_state(commits, source) == receivers


@pytest.mark.parametrize("snapshot_every, restored", [(1, 5), (3, 3), (10, 0)])
def test_a_restore_goes_back_to_the_last_snapshot_of_the_commit_policy(snapshot_every,
                                                                       restored):
    weights = tf.Variable(0.0)
    state = tfe.TensorFlowState([weights], step=0, snapshot_every=snapshot_every)
    state.bind(_Job())
    for _ in range(5):
        weights.assign_add(1.0)
        state.step += 1
        state.commit()
    assert (state.commits, state.uncommitted_steps()) == (5, 5 - restored)
    state.restore()
    assert (state.step, state.commits, float(weights.numpy())) == (restored, restored, restored)


def test_a_commit_policy_below_one_is_refused():
    with pytest.raises(ValueError, match="snapshot_every must be >= 1"):
        tfe.State(step=0, snapshot_every=0)


def test_a_node_prepares_before_joining_to_receive_every_variable_of_its_state():
    weights, bias = tf.Variable([1.0]), tf.Variable(0.0)
    prepared = []
    state = tfe.TensorFlowState([weights, bias], step=0)
    state.bind(_Job(prepare=prepared.append))
    state.prepare_to_join()
    assert prepared == [[weights, bias]]


def test_a_member_prepares_both_sides_of_its_syncs_before_the_first():
    weights = tf.Variable([1.0])
    prepared = []
    state = tfe.TensorFlowState([weights], step=0)
    state.bind(_Job(prepare=prepared.append))
    state.prepare_syncs()
    assert prepared == [[weights]]
    # A State of Python values has nothing to prepare.
    values = tfe.State(step=0)
    values.bind(_Job())
    values.prepare_syncs()


def test_members_at_the_same_commit_keep_their_variables_and_move_nothing():
    weights = tf.Variable([1.0])
    state = tfe.TensorFlowState([weights], step=0)
    state.step = 7
    object.__setattr__(state, "_commits", 7)
    broadcasts = []
    _members_ahead(state, lambda variables, source, receivers, one_group: broadcasts.append(source))
    state.sync()
    assert broadcasts == []
    assert (state.step, state.commits, weights.numpy().tolist()) == (7, 7, [1.0])


def _recording_broadcasts(state, exchange, generation) -> list:
    """Binds `state` to a job whose broadcasts only record (source, receivers, one_group)."""
    broadcasts = []
    state.bind(_Job(exchange, lambda v, source, receivers, one_group:
                    broadcasts.append((source, receivers, one_group)), generation=generation))
    return broadcasts


def test_members_that_never_committed_take_the_chiefs_variables():
    weights = tf.Variable([1.0])
    state = tfe.TensorFlowState([weights], step=0)
    broadcasts = _recording_broadcasts(state, lambda topic, blob: {
                                  0: blob if topic != "state" else _state({"step": 0}, 0, like=blob),
                                  1: blob}, generation=1)
    state.sync()
    # Every member initialized its own variables: even at zero commits they differ. At the
    # start nobody is a newcomer to blame: one group.
    assert broadcasts == [(0, [1], True)]


def test_a_member_in_step_with_the_source_takes_no_part_in_a_newcomers_sync():
    weights = tf.Variable([1.0])
    state = tfe.TensorFlowState([weights], step=0)
    state.step = 7
    object.__setattr__(state, "_commits", 7)
    broadcasts = _recording_broadcasts(state, lambda topic, blob: {
                                  0: blob if topic != "state" else _state({"step": 7}, 7, like=blob),
                                  1: blob,
                                  2: blob if topic != "state" else _state({"step": 0}, 0, like=blob)},
                                       generation=3)
    state.sync()
    # Node 0 sends to node 2 only; node 1 holds the same commit already.
    assert broadcasts == []
    assert (state.step, state.commits, weights.numpy().tolist()) == (7, 7, [1.0])


def _never_broadcast(tensors, source, receivers, one_group):
    raise AssertionError("no variable may be sent when the layouts differ")


def test_a_node_whose_variables_differ_from_the_members_says_which_and_takes_nothing():
    weights = tf.Variable([1.0], name="weights")
    state = tfe.TensorFlowState([weights], step=3)
    _members_ahead(state, _never_broadcast,
                   layouts={0: [("weights:0", (2,), "float32")]})
    with pytest.raises(StateLayoutMismatch, match=r"weights:0', \(1,\).*weights:0', \(2,\)"):
        state.sync()
    assert (state.step, state.commits, weights.numpy().tolist()) == (3, 0, [1.0])


def test_members_re_form_without_a_node_whose_variables_differ():
    weights = tf.Variable([1.0], name="weights")
    state = tfe.TensorFlowState([weights], step=3)
    # Node 0 is the source and node 1 matches it; node 2 (a newcomer) has one variable more.
    _members_ahead(state, _never_broadcast,
                   layouts={2: [("weights:0", (1,), "float32"), ("extra:0", (), "float32")]})
    with pytest.raises(GenerationEnded, match=r"\[2\]"):
        state.sync()


def test_a_written_state_is_read_back_by_a_new_state_and_a_different_one_is_refused(tmp_path):
    path = str(tmp_path / "state.npz")
    weights = tf.Variable([1.0, 2.0])
    state = tfe.TensorFlowState([weights], epoch=2, batch=0)
    assert not state.read(path), "a missing file is no error: the job starts afresh"
    weights.assign([3.0, 4.0])
    state.save()
    weights.assign([5.0, 6.0])  # not committed: not written
    state.write(path)
    restarted = tf.Variable([0.0, 0.0])
    fresh = tfe.TensorFlowState([restarted], epoch=0, batch=0)
    assert fresh.read(path)
    assert restarted.numpy().tolist() == [3.0, 4.0]
    assert (fresh.epoch, fresh.batch) == (2, 0)
    restarted.assign([9.0, 9.0])
    fresh.restore()  # the read state is the snapshot a failure goes back to
    assert restarted.numpy().tolist() == [3.0, 4.0]
    other = tfe.TensorFlowState([tf.Variable([0.0, 0.0, 0.0])], epoch=0, batch=0)
    with pytest.raises(StateLayoutMismatch, match="state.npz.*variable #0"):
        other.read(path)


def test_a_re_form_drops_the_keras_evaluation_and_prediction_functions():
    """They bake in the world size: Keras rebuilds them for the new one when next used."""
    model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
    model.compile(loss="mse")
    model.evaluate(tf.ones([4, 2]), tf.ones([4, 1]), verbose=0)
    model.predict(tf.ones([4, 2]), verbose=0)
    assert model.test_function is not None and model.predict_function is not None
    state = tfe.KerasState(model, epoch=0)
    reset = []
    state.register_reset_callbacks([lambda: reset.append(True)])
    state.on_reset()
    assert model.test_function is None and model.predict_function is None and reset == [True]
    model.evaluate(tf.ones([4, 2]), tf.ones([4, 1]), verbose=0)
    assert model.test_function is not None


def test_a_keras_state_with_a_commit_policy_restores_weights_and_slots_updated_in_place():
    """Keras 3's Adam updates the weights and both slots in place (copy-on-write while held)."""
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
    optimizer = tf.keras.optimizers.Adam(0.1)
    optimizer.build(model.trainable_variables)
    state = tfe.KerasState(model, optimizer, step=0, snapshot_every=2)
    state.bind(_Job())

    def values():
        return [v.numpy().copy() for v in model.weights + optimizer.variables]

    def train_and_commit():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(tf.ones([4, 3])) ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables))
        state.step += 1
        state.commit()

    for step in range(1, 4):
        train_and_commit()
        if step == 2:
            held = values()
    assert any(not np.array_equal(h, v) for h, v in zip(held, values()))
    state.restore()
    assert state.step == 2
    for h, v in zip(held, values()):
        np.testing.assert_array_equal(h, v)


def test_a_state_outside_the_elastic_run_says_where_to_commit():
    state = tfe.State(step=0)
    with pytest.raises(RuntimeError, match="inside a function decorated with "
                                           "tensorflow_elastic.run"):
        state.commit()


def test_a_state_read_before_the_run_takes_its_input_cursors_when_it_is_bound(tmp_path):
    """A custom loop's elastic input: its cursor is part of the state the job wrote, and the
    job a state belongs to holds it, so the state learns of it only when tfe.run binds it."""
    path = str(tmp_path / "state.npz")
    cursor = tf.Variable(42, dtype=tf.int64, name="cursor")
    writer = tfe.TensorFlowState([tf.Variable([3.0])], step=7)
    job = _Job()
    job.snapshot_extras = lambda: (None, [cursor])
    writer.bind(job)
    writer.save()
    writer.write(path)

    weights, resumed_cursor = tf.Variable([0.0]), tf.Variable(0, dtype=tf.int64, name="cursor")
    reader = tfe.TensorFlowState([weights], step=0)
    assert reader.read(path)
    assert (reader.step, weights.numpy().tolist()) == (7, [3.0])
    resumed = _Job()
    resumed.snapshot_extras = lambda: (None, [resumed_cursor])
    reader.bind(resumed)
    assert int(resumed_cursor.numpy()) == 42


def test_a_member_behind_does_not_overwrite_a_later_backup_and_leaves_no_temporary_file(tmp_path):
    path = str(tmp_path / "state.npz")
    weights = tf.Variable([1.0])
    ahead = tfe.TensorFlowState([weights], step=9)
    object.__setattr__(ahead, "_saved_commits", 9)
    assert ahead.write(path)
    behind = tfe.TensorFlowState([tf.Variable([5.0])], step=4)
    object.__setattr__(behind, "_saved_commits", 4)
    assert not behind.write(path)
    fresh = tfe.TensorFlowState([tf.Variable([0.0])], step=0)
    assert fresh.read(path) and fresh.step == 9 and fresh.commits == 9
    assert os.listdir(tmp_path) == ["state.npz"]
    assert not [name for name in os.listdir(path) if name.endswith(".tmp")]
    (tmp_path / "state.npz" / "checkpoint").write_bytes(b"not a pointer")  # a torn one is replaced
    assert behind.write(path)
