"""The worker of benchmarks/recovery.py: a small MLP trained in a custom loop.

--mode elastic: ElasticMultiWorkerMirroredStrategy, a commit every step, tfe.run.
--mode mwms: stock MultiWorkerMirroredStrategy from TF_CONFIG (the baseline);
with --backup_dir it resumes from the latest checkpoint there and saves one
every --save_every steps (the chief there, the others to a scratch copy, as
TensorFlow's multi-worker checkpointing guide does), so a supervisor can
restart it after a failure.
Both run the same step function on the same data and print one JSON line per
step: {"t": unix time, "step", "node", "generation", "world", "pid"}.
With --blocks the steps come in blocks, each started by a line on stdin with its
number of steps (0 or end of input: stop), so a driver can interleave two
groups of workers on the same machine.
"""

import argparse
import json
import os
import sys
import time

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--mode", choices=["elastic", "mwms"], required=True)
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--global_batch", type=int, default=48)
parser.add_argument("--backup_dir", help="mwms mode: resume from and save checkpoints here")
parser.add_argument("--save_every", type=int, default=10, help="mwms mode: steps between saves")
parser.add_argument("--blocks", action="store_true", help="run blocks of steps read from stdin")
parser.add_argument("--pause_before_training", type=float, default=0.0,
                    help="elastic mode: print {\"paused\": node} and sleep this long before "
                    "training (the other members wait for it in the first state sync)")
parser.add_argument("--pause_every", type=int, default=0,
                    help="elastic mode: every this many steps, pause in Python before the commit")
parser.add_argument("--pause_s", type=float, default=1.0, help="how long each pause lasts")
parser.add_argument("--pause_kind", choices=["python", "gil"], default="python",
                    help="python: a loop of Python code (other threads get the GIL between "
                    "bytecodes); gil: one C call that holds the GIL throughout")
args = parser.parse_args()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tensorflow_elastic as tfe  # noqa: E402
from tensorflow_elastic import ops  # noqa: E402

if args.mode == "elastic":
    runtime = tfe.init()
    strategy = tfe.ElasticMultiWorkerMirroredStrategy()
else:
    runtime = None
    strategy = tf.distribute.MultiWorkerMirroredStrategy()

# How many integers sum() adds per second on this machine, for --pause_kind gil.
GIL_LOOP_PER_S = 0.0
if args.pause_every and args.pause_kind == "gil":
    _started = time.perf_counter()
    sum(range(5_000_000))
    GIL_LOOP_PER_S = 5_000_000 / (time.perf_counter() - _started)

rng = np.random.RandomState(0)
features = tf.constant(rng.randn(8192, 32).astype(np.float32))
targets = tf.constant((rng.randn(8192, 1) > 0).astype(np.float32))
with strategy.scope():
    layers = [tf.Variable(rng.randn(32, 64).astype(np.float32) * 0.1), tf.Variable(tf.zeros([64])),
              tf.Variable(rng.randn(64, 64).astype(np.float32) * 0.1), tf.Variable(tf.zeros([64])),
              tf.Variable(rng.randn(64, 1).astype(np.float32) * 0.1), tf.Variable(tf.zeros([1]))]
world = tf.Variable(1, dtype=tf.int64)
rank = tf.Variable(0, dtype=tf.int64)


def model(x):
    h = tf.nn.relu(x @ layers[0] + layers[1])
    h = tf.nn.relu(h @ layers[2] + layers[3])
    return h @ layers[4] + layers[5]


@tf.function
def train_step(step):
    start, size = ops.global_batch_slice(step, args.global_batch, world, rank)
    index = tf.range(start, start + size) % features.shape[0]
    x, y = tf.gather(features, index), tf.gather(targets, index)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x)
            loss = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(y, logits)) / args.global_batch
        grads = tf.distribute.get_replica_context().all_reduce("SUM", tape.gradient(loss, layers))
        for v, g in zip(layers, grads):
            v.assign_sub(0.1 * g)
        return loss

    return strategy.reduce("SUM", strategy.run(replica_step, args=(x, y)), axis=None)


def block_end(step):
    """Where the current block of steps ends: --steps, or with --blocks `step` + the stdin line."""
    if not args.blocks:
        return args.steps
    return step + int(sys.stdin.readline() or 0)


def pause(seconds, kind):
    """Busy in Python for about `seconds` (a slow callback, a big serialization)."""
    if kind == "gil":
        sum(range(int(seconds * GIL_LOOP_PER_S)))  # one builtin call: the GIL is never released
        return
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def report(step, node, generation, world_size):
    print(json.dumps({"t": time.time(), "step": step, "node": node, "generation": generation,
                      "world": world_size, "pid": os.getpid()}), flush=True)


if args.mode == "mwms":
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    size = len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"])
    world.assign(size)
    rank.assign(task)
    first = 0
    if args.backup_dir:
        saved_step = tf.Variable(0, dtype=tf.int64)
        checkpoint = tf.train.Checkpoint(layers=layers, step=saved_step)
        directory = args.backup_dir if task == 0 else os.path.join(args.backup_dir,
                                                                    f"scratch-{task}")
        manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=2)
        latest = tf.train.latest_checkpoint(args.backup_dir)
        if latest:
            checkpoint.restore(latest)
            first = int(saved_step.numpy())
    step = first
    end = block_end(step)
    while step < end:
        train_step(tf.constant(step, tf.int64))
        step += 1
        report(step, task, 1, size)
        if args.backup_dir and step % args.save_every == 0:
            saved_step.assign(step)
            manager.save()
        if step == end:
            end = block_end(step)
else:
    def follow_membership():
        world.assign(runtime.membership.world_size)
        rank.assign(runtime.membership.rank)

    # Warm-up before joining: a newcomer traces its step while the members train.
    train_step.get_concrete_function(tf.TensorSpec([], tf.int64))
    state = tfe.TensorFlowState(layers, step=0)
    state.register_reset_callbacks([follow_membership])

    @tfe.run
    def train(state):
        follow_membership()
        end = block_end(state.step)
        while state.step < end:
            train_step(tf.constant(state.step, tf.int64))
            state.step += 1
            report(state.step, runtime.node_id, runtime.generation, runtime.membership.world_size)
            if args.pause_every and state.step % args.pause_every == 0:
                pause(args.pause_s, args.pause_kind)
            state.commit()
            if state.step == end:
                end = block_end(state.step)

    if args.pause_before_training:
        print(json.dumps({"paused": runtime.node_id}), flush=True)
        time.sleep(args.pause_before_training)
    train(state)
sys.stdout.flush()
os._exit(0)
