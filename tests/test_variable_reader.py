"""VariableReader: the one-op read a commit makes of every variable."""

import subprocess
import sys

import tensorflow as tf

from tensorflow_elastic.strategy.variable_reader import VariableReader


def test_reads_every_variable_in_order_whatever_its_dtype():
    variables = [tf.Variable([1.0, 2.0]), tf.Variable(7, dtype=tf.int64),
                 tf.Variable([True, False]), tf.Variable([0.5], dtype=tf.float64)]
    values = VariableReader(variables)()
    assert [v.dtype for v in values] == [tf.float32, tf.int64, tf.bool, tf.float64]
    assert values[0].numpy().tolist() == [1.0, 2.0]
    assert int(values[1]) == 7
    assert values[2].numpy().tolist() == [True, False]
    assert values[3].numpy().tolist() == [0.5]


def test_a_read_is_not_changed_by_later_in_place_updates():
    weights = tf.Variable(tf.ones([8]))
    read = VariableReader([weights])
    before = read()[0]
    weights.assign_sub(tf.ones([8]))
    assert before.numpy().tolist() == [1.0] * 8
    assert read()[0].numpy().tolist() == [0.0] * 8


def test_no_variables_reads_nothing():
    assert VariableReader([])() == []


_TWO_DEVICES = """
import tensorflow as tf
from tensorflow_elastic.strategy.variable_reader import VariableReader
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
with tf.device("/cpu:0"):
    a, c = tf.Variable(1.0), tf.Variable(3.0)
with tf.device("/cpu:1"):
    b = tf.Variable(2.0)
print([float(v) for v in VariableReader([a, b, c])()])
"""


def test_variables_on_several_devices_keep_their_order():
    out = subprocess.run([sys.executable, "-c", _TWO_DEVICES], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[1.0, 2.0, 3.0]"
