"""The library's AssignAdd/AssignSub kernels: chosen over TensorFlow's on CPU, and the same values
as TensorFlow's two passes whether a snapshot shares the buffer or not, the held values untouched."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import kernels

from tensorflow_elastic import environment
from tensorflow_elastic.ops import load_op_library
from tensorflow_elastic.ops.variable_snapshot import VariableSnapshot

FLOAT_TYPES = [tf.float16, tf.bfloat16, tf.float32, tf.float64]


@pytest.fixture(autouse=True, scope="module")
def _library():
    load_op_library()


@pytest.mark.parametrize("op", ["AssignAddVariableOp", "AssignSubVariableOp"])
def test_the_library_registers_cpu_kernels_above_tensorflows(op):
    chosen = set()
    for kernel in kernels.get_registered_kernels_for_op(op).kernel:
        if kernel.device_type == "CPU" and kernel.priority > 0:
            (constraint,) = kernel.constraint
            chosen.update(constraint.allowed_values.list.type)
    assert chosen == {dtype.as_datatype_enum for dtype in FLOAT_TYPES}


def _values(dtype, seed):
    return tf.cast(tf.random.stateless_normal([257, 3], seed=[seed, 7]), dtype)


@pytest.mark.parametrize("dtype", FLOAT_TYPES)
@pytest.mark.parametrize("held", [False, True], ids=["unshared", "held-by-a-snapshot"])
def test_updates_equal_tensorflows_arithmetic_and_leave_held_values_alone(dtype, held):
    start, delta = _values(dtype, 1), _values(dtype, 2)
    variable = tf.Variable(start)
    snapshot = VariableSnapshot([variable])
    if held:
        snapshot.take()

    @tf.function
    def update(x):
        variable.assign_add(x * 2)  # a fresh delta: its buffer can become the variable's
        variable.assign_sub(x)

    update(delta)
    expected = (start + delta * 2) - delta
    np.testing.assert_array_equal(variable.numpy(), expected.numpy())
    variable.assign_add(delta)  # eager: the caller holds delta, so it is not written into
    np.testing.assert_array_equal(variable.numpy(), (expected + delta).numpy())
    np.testing.assert_array_equal(delta.numpy(), _values(dtype, 2).numpy())
    if held:
        np.testing.assert_array_equal(snapshot.saved_values()[0].numpy(), start.numpy())


def test_a_delta_that_is_used_after_the_update_keeps_its_value():
    variable = tf.Variable(tf.ones([64]))
    snapshot = VariableSnapshot([variable])
    snapshot.take()

    @tf.function
    def update(x):
        delta = x * 3
        variable.assign_add(delta)
        return delta + 0

    returned = update(tf.ones([64]))
    assert returned.numpy().tolist() == [3.0] * 64
    assert variable.numpy().tolist() == [4.0] * 64
    assert snapshot.saved_values()[0].numpy().tolist() == [1.0] * 64


def test_a_variable_in_copy_on_read_mode_keeps_its_held_buffer():
    table = tf.Variable(tf.zeros([4, 2]))
    table.scatter_add(tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1])))  # copy-on-read mode
    snapshot = VariableSnapshot([table])
    snapshot.take()
    table.assign_add(tf.ones([4, 2]))
    table.assign_sub(2 * tf.ones([4, 2]))
    assert snapshot.saved_values()[0].numpy().tolist() == [[0, 0], [1, 1], [0, 0], [0, 0]]
    assert table.numpy().tolist() == [[-1, -1], [0, 0], [-1, -1], [-1, -1]]


def test_a_delta_of_another_shape_is_tensorflows_error():
    variable = tf.Variable(tf.ones([3]))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"Cannot update variable with shape \[3\] using a Tensor with shape "
                             r"\[2\], shapes must be equal"):
        variable.assign_add(tf.ones([2]))
    assert variable.numpy().tolist() == [1.0] * 3


def test_a_delta_of_another_dtype_is_an_error_not_a_crash():
    variable = tf.Variable(tf.ones([3]))
    snapshot = VariableSnapshot([variable])
    snapshot.take()
    with pytest.raises(tf.errors.InvalidArgumentError, match="DType of variable handle and value"):
        tf.raw_ops.AssignAddVariableOp(resource=variable.handle,
                                       value=tf.ones([3], tf.float64))
    assert variable.numpy().tolist() == [1.0] * 3


def test_integer_variables_keep_tensorflows_kernel():
    counter = tf.Variable(5, dtype=tf.int64)
    snapshot = VariableSnapshot([counter])
    snapshot.take()
    counter.assign_add(2)
    assert int(counter) == 7 and int(snapshot.saved_values()[0]) == 5


_TWO_PASSES = """
import tensorflow as tf
from tensorflow_elastic.ops.variable_snapshot import VariableSnapshot
variable = tf.Variable([1.0, 2.0])
snapshot = VariableSnapshot([variable])
snapshot.take()
tf.function(lambda: variable.assign_sub(tf.constant([0.5, 0.5]) * 2))()
print(variable.numpy().tolist(), snapshot.saved_values()[0].numpy().tolist())
"""


def test_tensorflows_two_passes_on_request_give_the_same_values():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **{environment.ONE_PASS_UPDATES: "0"})
    out = subprocess.run([sys.executable, "-c", _TWO_PASSES], capture_output=True, text=True,
                         timeout=120, check=True, env=env)
    assert out.stdout.strip().splitlines()[-1] == "[0.0, 1.0] [1.0, 2.0]"
