"""A plain MultiWorkerMirroredStrategy script (no tensorflow_elastic import): linear regression.

It reads TF_CONFIG, resumes from the latest checkpoint in BACKUP_DIR (the
chief writes there; other workers write to a scratch copy, as TensorFlow's
multi-worker checkpointing guide does), and prints one JSON line per step:
{"step", "world", "task", "resumed_from"}. argv: BACKUP_DIR STEPS STEP_SLEEP_S.
"""

import json
import os
import sys
import time

import numpy as np
import tensorflow as tf

BACKUP_DIR, STEPS, STEP_SLEEP_S = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
SAVE_EVERY = 5
FEATURES = 4
GLOBAL_BATCH = 8

strategy = tf.distribute.MultiWorkerMirroredStrategy()
task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
world = strategy.num_replicas_in_sync
rng = np.random.RandomState(0)
features = rng.randn(1024, FEATURES).astype(np.float32)
targets = features @ rng.randn(FEATURES, 1).astype(np.float32)

with strategy.scope():
    weights = tf.Variable(tf.zeros([FEATURES, 1]))
    step = tf.Variable(0, dtype=tf.int64)
checkpoint = tf.train.Checkpoint(weights=weights, step=step)
directory = BACKUP_DIR if task == 0 else os.path.join(BACKUP_DIR, f"scratch-{task}")
manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=2)
latest = tf.train.latest_checkpoint(BACKUP_DIR)
if latest:
    checkpoint.restore(latest)
resumed_from = int(step.numpy())


@tf.function
def train_step(x, y):
    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(tf.matmul(x, weights) - y)) / GLOBAL_BATCH
        grad = tf.distribute.get_replica_context().all_reduce("SUM", tape.gradient(loss, weights))
        weights.assign_sub(0.05 * grad)
        step.assign_add(1)
        return loss

    return strategy.run(replica_step, args=(x, y))


per_worker = GLOBAL_BATCH // world
while int(step.numpy()) < STEPS:
    start = (int(step.numpy()) * GLOBAL_BATCH + task * per_worker) % len(features)
    index = np.arange(start, start + per_worker) % len(features)
    train_step(tf.constant(features[index]), tf.constant(targets[index]))
    print(json.dumps({"step": int(step.numpy()), "world": world, "task": task,
                      "resumed_from": resumed_from}), flush=True)
    if int(step.numpy()) % SAVE_EVERY == 0:
        manager.save()
    time.sleep(STEP_SLEEP_S)
print(json.dumps({"done": True, "task": task, "step": int(step.numpy())}), flush=True)
