"""A worker of the multi-process strategy tests: linear regression in a custom loop.

Prints one JSON line per committed step ({"node", "step", "loss", "world",
"generation", "threads", "checksum"}) and a final {"done": ...} line (with the generations
its step was traced in). A newcomer warms up (tfe.warm_up) before it joins. Settings come from
the launcher-style environment (TFE_*) and argv: steps, sleep per step, and a
pause before training (printing {"paused": ...} first) that keeps the others
waiting in the first state sync. With HANG_FILE set (a path with "{node}" in
it), a worker whose file exists hangs in Python after its step, before the
commit, until the file is removed (its heartbeat thread keeps running).
"""

import json
import os
import sys
import time

import numpy as np
import tensorflow as tf

import tensorflow_elastic as tfe
from tensorflow_elastic import ops

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 60
STEP_SLEEP_S = float(sys.argv[2]) if len(sys.argv) > 2 else 0.05
PAUSE_BEFORE_TRAIN_S = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
HANG_FILE = os.environ.get("HANG_FILE", "")
GLOBAL_BATCH = 12
FEATURES = 8

rng = np.random.RandomState(0)
features = rng.randn(4096, FEATURES).astype(np.float32)
targets = features @ rng.randn(FEATURES, 1).astype(np.float32) + 0.5

runtime = tfe.init()
strategy = tfe.ElasticMultiWorkerMirroredStrategy()
with strategy.scope():
    weights = tf.Variable(tf.zeros([FEATURES, 1]))
    bias = tf.Variable(0.0)
world_size = tf.Variable(1, dtype=tf.int64)
rank = tf.Variable(0, dtype=tf.int64)
x_all = tf.constant(features)
y_all = tf.constant(targets)


def follow_membership():
    world_size.assign(runtime.membership.world_size)
    rank.assign(runtime.membership.rank)


traces = []


@tf.function
def train_step(step):
    traces.append(runtime.generation)
    start, size = ops.global_batch_slice(step, GLOBAL_BATCH, world_size, rank)
    index = tf.range(start, start + size) % x_all.shape[0]
    x, y = tf.gather(x_all, index), tf.gather(y_all, index)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(tf.matmul(x, weights) + bias - y)) / GLOBAL_BATCH
        grads = tape.gradient(loss, [weights, bias])
        grads = tf.distribute.get_replica_context().all_reduce("SUM", grads)
        weights.assign_sub(0.05 * grads[0])
        bias.assign_sub(0.05 * grads[1])
        return loss

    losses = strategy.run(replica_step, args=(x, y))
    return strategy.reduce("SUM", losses, axis=None)


state = tfe.TensorFlowState([weights, bias], step=0)
state.register_reset_callbacks([follow_membership])


@tfe.run
def train(state):
    follow_membership()
    while state.step < STEPS:
        loss = train_step(tf.constant(state.step, tf.int64))
        state.step += 1
        print(json.dumps({"node": runtime.node_id, "step": state.step, "loss": float(loss),
                          "world": runtime.membership.world_size,
                          "generation": runtime.generation,
                          "threads": len(os.listdir("/proc/self/task")),
                          "checksum": float(tf.reduce_sum(weights.read_value()) + bias.read_value())}),
              flush=True)
        time.sleep(STEP_SLEEP_S)
        while HANG_FILE and os.path.exists(HANG_FILE.format(node=runtime.node_id)):
            time.sleep(0.05)
        state.commit()


# A newcomer traces and runs its step alone before it joins (its result is replaced by the sync).
tfe.warm_up(train_step, tf.constant(0, tf.int64))
if PAUSE_BEFORE_TRAIN_S:
    print(json.dumps({"paused": True, "node": runtime.node_id}), flush=True)
    time.sleep(PAUSE_BEFORE_TRAIN_S)
train(state)
print(json.dumps({"done": True, "node": runtime.node_id, "traces": len(traces),
                  # The variables its commits hold (ordered steps: none).
                  "held": [v.name for v in state._held],
                  "traced_in": traces,
                  "weights": [float(v) for v in tf.reshape(weights.read_value(), [-1])]
                  + [float(bias.read_value())]}),
      flush=True)
sys.stdout.flush()
os._exit(0)
