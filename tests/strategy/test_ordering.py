"""The order of a step's writes after its collectives: the pure plan, and real traced steps on
a group of one (no cluster)."""

import pytest
import tensorflow as tf
from tensorflow.python.distribute import collective_util, reduce_util
from tensorflow.python.framework import ops

from tensorflow_elastic.strategy import collectives, ordering
from tensorflow_elastic.strategy.ordering import OpNode, plan


def test_a_write_after_the_collective_waits_for_it_and_for_a_later_one():
    nodes = [OpNode("grad", ()), OpNode("reduce", ("grad",)),
             OpNode("update", ("reduce",), writes=frozenset({"w"})),
             OpNode("loss_reduce", ("grad",))]
    decided = plan(nodes, ["reduce", "loss_reduce"])
    assert decided.ordered == ["update"] and decided.unordered == []


def test_a_write_before_the_collective_that_nothing_reads_waits_for_it():
    # Batch normalization's moving statistics: written in the forward pass, never read again.
    nodes = [OpNode("read_mean", (), reads=frozenset({"mean"})),
             OpNode("write_mean", ("read_mean",), writes=frozenset({"mean"})),
             OpNode("reduce", ("read_mean",))]
    decided = plan(nodes, ["reduce"])
    assert decided.ordered == ["write_mean"] and decided.unordered == []


def test_a_write_that_a_later_collective_reads_back_cannot_wait():
    # Read after the write (TensorFlow's automatic edges will order the read after it).
    nodes = [OpNode("write", (), writes=frozenset({"w"})),
             OpNode("read", (), reads=frozenset({"w"})),
             OpNode("reduce", ("read",))]
    decided = plan(nodes, ["reduce"])
    assert decided.ordered == [] and decided.unordered == ["write"]


def test_a_stateful_op_chained_after_a_write_counts_as_depending_on_it():
    nodes = [OpNode("write", (), writes=frozenset({"w"})),
             OpNode("print", ("write",), stateful=True),
             OpNode("random", (), stateful=True),
             OpNode("reduce", ("random",))]
    assert plan(nodes, ["reduce"]).unordered == ["write"]


@pytest.fixture
def order():
    step_order = ordering.StepOrder("/job:localhost/replica:0/task:0")
    ordering.use(step_order)
    yield step_order
    ordering._current.clear()


_launchers = []


def _all_reduce(value):
    """An all-reduce of the elastic strategy's kind in a group of one."""
    if not _launchers:
        with tf.init_scope():
            _launchers.append(collectives.ElasticCollectiveAllReduce(
                ["/device:CPU:0"], 1, collective_util.Options(),
                collectives.collective_keys_for(1), collectives.STEP_GROUP, 1))
    return _launchers[0]._all_reduce(reduce_util.ReduceOp.SUM, [value], 0,
                                collective_util.Options())[0]


def _ordered(order, variable):
    return order.is_ordered([ops.tensor_id(variable.handle)])


def test_a_traced_step_orders_its_updates_and_counts_its_runs(order):
    weights, slot, moving = tf.Variable(tf.ones([3])), tf.Variable(tf.zeros([3])), tf.Variable(0.0)

    @tf.function
    def step(x):
        moving.assign(moving * 0.9 + tf.reduce_mean(x))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(weights * x)
        grad = _all_reduce(tape.gradient(loss, weights))
        slot.assign_add(grad - slot)
        weights.assign_sub(0.1 * slot)
        return _all_reduce(loss)

    step(tf.ones([3]))
    step(tf.ones([3]))
    assert all(_ordered(order, v) for v in (weights, slot, moving))
    assert order.read_applied() == (2.0,)
    assert weights.numpy().tolist() == pytest.approx([0.8] * 3)


def test_writes_in_a_loop_of_steps_or_without_collectives_are_unordered(order):
    weights, counter = tf.Variable(tf.ones([2])), tf.Variable(0.0)

    @tf.function
    def two_steps():
        for _ in range(2):
            weights.assign_sub(0.1 * _all_reduce(weights.read_value()))

    @tf.function
    def count():
        counter.assign_add(1.0)

    two_steps()
    count()
    assert not _ordered(order, weights) and not _ordered(order, counter)


def test_a_variable_unordered_by_a_later_trace_is_told_before_that_step_runs(order):
    weights = tf.Variable(tf.ones([2]))
    told = []

    def listener():
        with tf.init_scope():  # called while the step is traced
            told.append(weights.numpy().tolist())

    order.listen(listener)

    @tf.function
    def ordered():
        weights.assign_sub(_all_reduce(weights.read_value()) * 0.5)

    @tf.function
    def unordered():
        weights.assign_sub(tf.ones([2]))
        return _all_reduce(weights.read_value())

    ordered()
    assert _ordered(order, weights) and told == []
    unordered()
    assert not _ordered(order, weights)
    assert told == [[0.5, 0.5]]  # before the step ran


def test_an_eager_collective_or_several_runs_between_commits_unorder_everything(order):
    weights = tf.Variable(tf.ones([2]))

    @tf.function
    def step():
        weights.assign_sub(_all_reduce(weights.read_value()) * 0.5)

    step()
    order.runs_between(0.0, 1.0)
    assert _ordered(order, weights)
    order.runs_between(1.0, 3.0)
    assert not _ordered(order, weights)

    eager = ordering.StepOrder("/job:localhost/replica:0/task:0")
    ordering.use(eager)
    _all_reduce(tf.ones([1]))
    assert eager.all_unordered


def test_the_state_sync_s_writes_are_not_a_step_s(order):
    broadcaster = collectives.VariableBroadcaster("/device:CPU:0")
    weights = tf.Variable(tf.ones([2]))

    @tf.function
    def step():
        weights.assign_sub(_all_reduce(weights.read_value()) * 0.5)

    step()
    broadcaster.prepare([weights], is_source=False)
    assert _ordered(order, weights)


def test_every_ordered_write_waits_for_every_collective_of_its_step(order):
    weights, moving = tf.Variable(tf.ones([3])), tf.Variable(0.0)

    @tf.function
    def step(x):
        moving.assign(moving * 0.9 + tf.reduce_mean(x))
        grad = _all_reduce(x * weights)
        weights.assign_sub(0.1 * grad)
        return _all_reduce(tf.reduce_sum(x))  # a collective after the update

    graph = step.get_concrete_function(tf.TensorSpec([3])).graph
    collective_ops = [op for op in graph.get_operations() if op.type.startswith("Collective")]
    writes = [op for op in graph.get_operations()
              if op.type in ("AssignVariableOp", "AssignSubVariableOp")]
    assert len(collective_ops) == 2 and len(writes) == 2

    def waits_for(op):
        seen, stack = set(), [op]
        while stack:
            current = stack.pop()
            for parent in [t.op for t in current.inputs] + list(current.control_inputs):
                if parent not in seen:
                    seen.add(parent)
                    stack.append(parent)
        return seen

    for write in writes:
        assert set(collective_ops) <= waits_for(write), write.name
