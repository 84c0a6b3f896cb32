"""A function's recoverable error skips TensorFlow's message annotation while the loop recovers.

The check runs in its own process: a collective that timed out leaves TensorFlow's collective
executor aborted for the rest of the process."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = r"""
import json
import tensorflow as tf
from tensorflow_elastic.strategy.function_errors import pass_recoverable_errors_at_once

recovering = {"on": False}

@tf.function
def lone_collective(x):
    # A group of two that only this process joins: DeadlineExceededError after 50 ms.
    return tf.raw_ops.CollectiveReduceV2(
        input=x * 2.0, group_size=tf.constant(2), group_key=tf.constant(1),
        instance_key=tf.constant(1), ordering_token=[], merge_op="Add", final_op="Id",
        timeout_seconds=0.05)

@tf.function
def not_a_number(x):
    return tf.debugging.check_numerics(x * float("nan"), "boom")

def annotated(function, on, install=True):
    recovering["on"] = on
    if install:
        pass_recoverable_errors_at_once(lambda: recovering["on"])
    try:
        function(tf.constant([1.0]))
    except tf.errors.OpError as error:
        return [type(error).__name__, "Detected at node" in error.message]
    return None

print(json.dumps({
    "before": annotated(lone_collective, True, install=False),
    "recovering": annotated(lone_collective, True),
    "not_recovering": annotated(lone_collective, False),
    "not_recoverable": annotated(not_a_number, True),
}))
"""


def test_only_a_recoverable_error_while_recovering_reaches_python_unannotated():
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {
        "before": ["DeadlineExceededError", True],
        "recovering": ["DeadlineExceededError", False],
        "not_recovering": ["DeadlineExceededError", True],
        "not_recoverable": ["InvalidArgumentError", True],
    }
