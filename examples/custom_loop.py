"""An elastic-aware custom training loop: nodes come and go inside the running processes.

    tfelastic-run --standalone --nproc_per_node 3 --nworkers 2:3 examples/custom_loop.py --steps 300

A small regression model on synthetic data (no downloads). Each global step
reads its slice of a global batch by rank (GlobalBatchSlice), so no sample is
seen twice when the world size changes; `tfe.run` restores the last commit
after a failure and re-forms; the learning rate follows the world size
through a reset callback. Every commit counts as a step: the runtime writes a
`step` event every TFE_STEP_EVENTS_EVERY (default 10) commits for progress
lines and `tfelastic plot`.
"""

import argparse
import time

import numpy as np
import tensorflow as tf

import tensorflow_elastic as tfe
from tensorflow_elastic import ops

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--global_batch", type=int, default=48)
parser.add_argument("--step_sleep", type=float, default=0.02,
                    help="seconds of extra work per step, to make a demo watchable")
args = parser.parse_args()

FEATURES = 16
runtime = tfe.init()  # before any TensorFlow op: it configures the collective runtime
strategy = tfe.ElasticMultiWorkerMirroredStrategy()
rng = np.random.RandomState(0)
x_all = tf.constant(rng.randn(8192, FEATURES).astype(np.float32))
y_all = tf.matmul(x_all, tf.constant(rng.randn(FEATURES, 1).astype(np.float32))) + 0.3
with strategy.scope():
    hidden = tf.Variable(tf.random.normal([FEATURES, 32], stddev=0.1, seed=1))
    output = tf.Variable(tf.random.normal([32, 1], stddev=0.1, seed=2))
    bias = tf.Variable(0.0)
world_size = tf.Variable(1, dtype=tf.int64)
rank = tf.Variable(0, dtype=tf.int64)
learning_rate = tf.Variable(0.01)


def follow_membership() -> None:
    """After every re-form: this node's rank and the world size, and a matching learning rate."""
    world_size.assign(runtime.membership.world_size)
    rank.assign(runtime.membership.rank)
    learning_rate.assign(0.01 * runtime.membership.world_size ** 0.5)


@tf.function
def train_step(step):
    start, size = ops.global_batch_slice(step, args.global_batch, world_size, rank)
    index = tf.range(start, start + size) % x_all.shape[0]
    x, y = tf.gather(x_all, index), tf.gather(y_all, index)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            prediction = tf.matmul(tf.nn.relu(tf.matmul(x, hidden)), output) + bias
            loss = tf.reduce_sum(tf.square(prediction - y)) / args.global_batch
        grads = tape.gradient(loss, [hidden, output, bias])
        grads = tf.distribute.get_replica_context().all_reduce("SUM", grads)
        for variable, grad in zip([hidden, output, bias], grads):
            variable.assign_sub(learning_rate * grad)
        return loss

    return strategy.reduce("SUM", strategy.run(replica_step, args=(x, y)), axis=None)


state = tfe.TensorFlowState([hidden, output, bias], step=0)
state.register_reset_callbacks([follow_membership])


@tfe.run
def train(state):
    follow_membership()
    while state.step < args.steps:
        loss = train_step(tf.constant(state.step, tf.int64))
        state.step += 1
        if state.step % 50 == 0:
            print(f"step {state.step} loss {float(loss):.4f} world {runtime.membership.world_size}",
                  flush=True)
        time.sleep(args.step_sleep)
        state.commit()


# A node joining a running job traces and runs its step alone first, while the members train.
tfe.warm_up(train_step, tf.constant(0, tf.int64))
train(state)
print(f"done: {state.step} steps", flush=True)
