"""A worker of the end-to-end elastic input test: linear regression over Dataset.range.

Every step prints {"node", "generation", "step", "ids"} (the element ids this
worker trained on) and the end prints {"done", "weights"}. argv: elements,
global batch size, sleep per step, and the sleep per step in the first
generation (slower, so that a newcomer's start-up on a slow machine cannot
outlast the job).
"""

import json
import os
import sys
import time

import tensorflow as tf

import tensorflow_elastic as tfe

ELEMENTS = int(sys.argv[1])
GLOBAL_BATCH = int(sys.argv[2])
STEP_SLEEP_S = float(sys.argv[3])
FIRST_GENERATION_STEP_SLEEP_S = float(sys.argv[4]) if len(sys.argv) > 4 else STEP_SLEEP_S
STEPS = ELEMENTS // GLOBAL_BATCH
LEARNING_RATE = 0.1
TRUE_WEIGHTS = [0.5, -1.0, 2.0, 0.25]

runtime = tfe.init()
strategy = tfe.ElasticMultiWorkerMirroredStrategy()
batches = strategy.distribute_elastic_dataset(tf.data.Dataset.range(ELEMENTS), GLOBAL_BATCH)
with strategy.scope():
    weights = tf.Variable(tf.zeros([4], tf.float64))


def features(ids):
    i = tf.cast(ids, tf.float64)
    return tf.stack([tf.sin(i), tf.cos(i), tf.math.floormod(i, 7.0) / 7.0, tf.ones_like(i)], axis=1)


@tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
def train_step(ids):
    def replica_step(ids):
        x = features(ids)
        y = tf.linalg.matvec(x, tf.constant(TRUE_WEIGHTS, tf.float64))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(tf.linalg.matvec(x, weights) - y)) / GLOBAL_BATCH
        grad = tf.distribute.get_replica_context().all_reduce("SUM", tape.gradient(loss, weights))
        weights.assign_sub(LEARNING_RATE * grad)
        return loss

    return strategy.reduce("SUM", strategy.run(replica_step, args=(ids,)), axis=None)


state = tfe.TensorFlowState([weights], step=0)
iterator = iter(batches)


@tfe.run
def train(state):
    while state.step < STEPS:
        ids = next(iterator)
        train_step(ids)
        state.step += 1
        print(json.dumps({"node": runtime.node_id, "generation": runtime.generation,
                          "step": state.step, "ids": [int(i) for i in ids.numpy()]}), flush=True)
        time.sleep(FIRST_GENERATION_STEP_SLEEP_S if runtime.generation == 1 else STEP_SLEEP_S)
        state.commit()


train(state)
print(json.dumps({"done": True, "node": runtime.node_id,
                  "weights": [float(v) for v in weights.read_value().numpy()]}), flush=True)
sys.stdout.flush()
os._exit(0)
