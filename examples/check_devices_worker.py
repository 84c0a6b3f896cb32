"""The training examples/check_devices.py runs on every worker (or, with --replay, alone).

Linear regression in float64 over the elastic input (features computed from each
example's id), every local device one replica: the machine's GPUs when the
worker sees any, else --cpu_devices logical CPU devices. Every example's id is
counted, summed over all replicas, in a variable the state holds, so the end
shows whether each example was trained on exactly once. The worker trains until
the step written in the control directory's ``stop`` file.

Lines it prints (JSON): {"devices", "gpus", "node", "pid"} once; {"step", "node",
"pid", "generation", "replicas"} every step; at the end {"done", "node", "step",
"weights", "digests", "once"}: "digests" holds, for each variable, one digest
per local copy (what each replica holds), "once" whether every example up to
the last step was counted once and no other. With --replay N it trains N global
batches in one plain process (no strategy) and prints {"weights"}.
"""

import argparse
import hashlib
import json
import os
import sys
import time

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--control", help="the directory of the stop file (not with --replay)")
parser.add_argument("--cpu_devices", type=int, default=2,
                    help="logical CPU devices a worker drives when it sees no GPU (default 2)")
parser.add_argument("--global_batch", type=int, default=24)
parser.add_argument("--step_sleep", type=float, default=0.05,
                    help="seconds between steps, so that a kill lands mid-run")
parser.add_argument("--replay", type=int, default=None, metavar="STEPS",
                    help="train STEPS global batches in one plain process and print the weights")
args = parser.parse_args()

import tensorflow as tf  # noqa: E402

EXAMPLES = 20_000  # more than a check trains on; the id histogram has one bin per example
FEATURES = 8
LEARNING_RATE = 0.05
# A Python list: a tensor now would start TensorFlow before the logical devices are set.
TRUE_WEIGHTS = [0.5, -1.0, 2.0, 0.25, -0.75, 1.5, -0.5, 1.0]


def features(ids):
    angles = tf.cast(ids, tf.float64)[:, None] * tf.range(1, FEATURES // 2 + 1,
                                                           dtype=tf.float64) * 0.37
    return tf.concat([tf.sin(angles), tf.cos(angles)], axis=1)


def squared_error(ids, weights):
    """The summed squared error of `weights` on the examples `ids`."""
    x = features(ids)
    return tf.reduce_sum(tf.square(tf.linalg.matvec(x, weights) - tf.linalg.matvec(
        x, tf.constant(TRUE_WEIGHTS, tf.float64))))


if args.replay is not None:
    weights = tf.Variable(tf.zeros([FEATURES], tf.float64))
    for ids in tf.data.Dataset.range(args.replay * args.global_batch).batch(args.global_batch):
        with tf.GradientTape() as tape:
            loss = squared_error(ids, weights)
        weights.assign_sub(LEARNING_RATE * tape.gradient(loss, weights) / args.global_batch)
    print(json.dumps({"weights": weights.numpy().tolist()}), flush=True)
    sys.exit(0)

gpus = tf.config.list_physical_devices("GPU")
for gpu in gpus:
    # Workers may share a GPU (fewer GPUs than workers): each takes only what it uses.
    tf.config.experimental.set_memory_growth(gpu, True)
if not gpus:
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration()] * args.cpu_devices)

import tensorflow_elastic as tfe  # noqa: E402

runtime = tfe.init()
strategy = tfe.ElasticMultiWorkerMirroredStrategy(
    devices=None if gpus else [f"CPU:{i}" for i in range(args.cpu_devices)])
print(json.dumps({"devices": list(strategy.extended.worker_devices),
                  "gpus": [gpu.name for gpu in gpus], "node": runtime.node_id,
                  "pid": os.getpid()}), flush=True)

with strategy.scope():
    weights = tf.Variable(tf.zeros([FEATURES], tf.float64))
    counts = tf.Variable(tf.zeros([EXAMPLES], tf.float64))
state = tfe.TensorFlowState([weights, counts], step=0)
batches = strategy.distribute_elastic_dataset(tf.data.Dataset.range(EXAMPLES), args.global_batch)


@tf.function(input_signature=[batches.replica_element_spec])
def train_step(ids):
    def replica_step(ids):
        with tf.GradientTape() as tape:
            loss = squared_error(ids, weights)
        seen = tf.math.unsorted_segment_sum(tf.ones_like(ids, tf.float64), ids, EXAMPLES)
        grad, seen = tf.distribute.get_replica_context().all_reduce(
            "SUM", [tape.gradient(loss, weights), seen])
        weights.assign_sub(LEARNING_RATE * grad / args.global_batch)
        counts.assign_add(seen)

    strategy.run(replica_step, args=(ids,))


def stop_step() -> float:
    try:
        with open(os.path.join(args.control, "stop")) as f:
            return int(f.read())
    except (FileNotFoundError, ValueError):
        return float("inf")


iterator = iter(batches)


@tfe.run
def train(state):
    while state.step < stop_step():
        train_step(next(iterator))
        state.step += 1
        print(json.dumps({"step": state.step, "node": runtime.node_id, "pid": os.getpid(),
                          "generation": runtime.generation,
                          "replicas": strategy.num_replicas_in_sync}), flush=True)
        time.sleep(args.step_sleep)
        state.commit()


def local_copies(variable) -> list:
    """Every local copy of `variable`, one per replica of this worker."""
    return [copy.numpy() for copy in strategy.experimental_local_results(variable)]


tfe.warm_up(lambda: train_step(next(iterator)))  # a newcomer: its step traced and run, alone
train(state)
trained = state.step * args.global_batch
first = local_copies(counts)[0]
print(json.dumps({
    "done": True, "node": runtime.node_id, "step": state.step,
    "weights": local_copies(weights)[0].tolist(),
    "digests": [[hashlib.sha256(copy.tobytes()).hexdigest() for copy in local_copies(v)]
                for v in (weights, counts)],
    "once": bool((first[:trained] == 1).all() and (first[trained:] == 0).all())}), flush=True)
