"""The worker of benchmarks/recovery.py: a model of benchmarks/models.py, Adam, a custom loop.

--mode elastic: ElasticMultiWorkerMirroredStrategy, a commit every step, tfe.run.
--mode mwms: stock MultiWorkerMirroredStrategy from TF_CONFIG (the baseline);
with --backup_dir it resumes from the latest checkpoint there and saves one
every --save_every steps (the chief there, the others to a scratch copy, as
TensorFlow's multi-worker checkpointing guide does), so a supervisor can
restart it after a failure.
Both run the same step function on the same data and print one JSON line per
step: {"t": unix time, "step", "node", "generation", "world", "pid"}, plus
"commit_s" (the previous step's commit time) in elastic mode.
With --blocks the steps come in blocks, each started by a line on stdin with its
number of steps (0 or end of input: stop), so a driver can interleave two
groups of workers on the same machine.
Elastic workers also print "mark NAME TIME" lines (Unix time) as they pass the
points of their start-up a newcomer's start is timed by: imported (TensorFlow and
the package), built (joined or registered, strategy and model), warmed (a
newcomer's warm-up step, run before it joins), prepared (its receiving side of the
state sync built, just before it asks to join), and with --hold_before_join held (warmed
up and its receiving side built, it waits for a line on stdin before it asks to join); with
--trace, "trace NAME TIME" lines too (and "trace _recover:in TIME" when a failed step's
error reaches the loop).
"""

import argparse
import json
import os
import sys
import time

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--mode", choices=["elastic", "mwms"], required=True)
parser.add_argument("--model", default="tiny", help="a model of benchmarks/models.py")
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--global_batch", type=int, default=48)
parser.add_argument("--snapshot_every", type=int, default=1,
                    help="elastic mode: the state's commit policy (a snapshot every N commits)")
parser.add_argument("--backup_dir", help="mwms mode: resume from and save checkpoints here")
parser.add_argument("--save_every", type=int, default=10, help="mwms mode: steps between saves")
parser.add_argument("--blocks", action="store_true", help="run blocks of steps read from stdin")
parser.add_argument("--pause_before_training", type=float, default=0.0,
                    help="elastic mode: print {\"paused\": node} and sleep this long before "
                    "training (the other members wait for it in the first state sync)")
parser.add_argument("--trace", action="store_true",
                    help="elastic mode: print \"trace NAME TIME\" when each stage of a "
                    "membership change returns (join, barrier, exchange, regroup, sync, broadcast)")
parser.add_argument("--hold_before_join", action="store_true",
                    help="elastic mode, a newcomer: once warmed up and ready to join, print "
                    "\"mark held TIME\" and wait for a line on stdin before it asks to join (a "
                    "replacement started before it is needed)")
parser.add_argument("--pause_every", type=int, default=0,
                    help="elastic mode: every this many steps, pause in Python before the commit")
parser.add_argument("--pause_s", type=float, default=1.0, help="how long each pause lasts")
parser.add_argument("--pause_kind", choices=["python", "gil"], default="python",
                    help="python: a loop of Python code (other threads get the GIL between "
                    "bytecodes); gil: one C call that holds the GIL throughout")
args = parser.parse_args()

import tensorflow as tf  # noqa: E402

import models  # noqa: E402
import tensorflow_elastic as tfe  # noqa: E402
from tensorflow_elastic import ops  # noqa: E402


def mark(name):
    """A point of the start-up, for the newcomer's start-to-first-step figure."""
    if args.mode == "elastic":
        print(f"mark {name} {time.time()}", flush=True)


mark("imported")

def traced(owner, name, entry=False):
    """Prints "trace NAME TIME" whenever `owner.name` returns or raises (with `entry`, also
    "trace NAME:in TIME" when it is called)."""
    inner = getattr(owner, name)

    def wrapper(*a, **k):
        if entry:
            print(f"trace {name}:in {time.time()}", flush=True)
        try:
            return inner(*a, **k)
        finally:
            print(f"trace {name} {time.time()}", flush=True)

    setattr(owner, name, wrapper)


if args.mode == "elastic":
    runtime = tfe.init()
    strategy = tfe.ElasticMultiWorkerMirroredStrategy()
    prepare_to_join = tfe.TensorFlowState.prepare_to_join

    def prepare_and_mark(self):
        prepare_to_join(self)
        mark("prepared")
        if args.hold_before_join:
            mark("held")
            sys.stdin.readline()

    tfe.TensorFlowState.prepare_to_join = prepare_and_mark
    if args.trace:
        for owner, names in ((runtime.session.client, ("join", "barrier", "synchronize")),
                             (strategy.extended, ("regroup", "broadcast_variables")),
                             (tfe.TensorFlowState, ("sync", "restore")),
                             (runtime, ("report_failure",))):
            for name in names:
                traced(owner, name)
        # A crash's detection: when the failed step's error reaches the loop.
        traced(runtime, "_recover", entry=True)
else:
    runtime = None
    strategy = tf.distribute.MultiWorkerMirroredStrategy()

# How many integers sum() adds per second on this machine, for --pause_kind gil.
GIL_LOOP_PER_S = 0.0
if args.pause_every and args.pause_kind == "gil":
    _started = time.perf_counter()
    sum(range(5_000_000))
    GIL_LOOP_PER_S = 5_000_000 / (time.perf_counter() - _started)

global_batch = args.global_batch
with strategy.scope():
    model = models.build(args.model, global_batch)
world = tf.Variable(1, dtype=tf.int64)
rank = tf.Variable(0, dtype=tf.int64)
mark("built")


@tf.function
def train_step(step):
    start, size = ops.global_batch_slice(step, global_batch, world, rank)
    index = tf.range(start, start + size) % model.features.shape[0]
    x, y = tf.gather(model.features, index), tf.gather(model.targets, index)
    return strategy.reduce("SUM", strategy.run(model.replica_step, args=(x, y)), axis=None)


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


def report(step, node, generation, world_size, **extra):
    print(json.dumps({"t": time.time(), "step": step, "node": node, "generation": generation,
                      "world": world_size, "pid": os.getpid(), **extra}), flush=True)


if args.mode == "mwms":
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    size = len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"])
    world.assign(size)
    rank.assign(task)
    first = 0
    if args.backup_dir:
        saved_step = tf.Variable(0, dtype=tf.int64)
        checkpoint = tf.train.Checkpoint(state=model.state_variables, step=saved_step)
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

    # Warm-up before joining: a newcomer traces and runs its step once, alone (its state is
    # replaced by the members' at the sync), while the members train.
    if tfe.warm_up(train_step, tf.constant(0, tf.int64)):
        mark("warmed")
    else:
        train_step.get_concrete_function(tf.TensorSpec([], tf.int64))
    state = tfe.TensorFlowState(model.state_variables, step=0,
                                snapshot_every=args.snapshot_every)
    state.register_reset_callbacks([follow_membership])

    commit_s = None  # the previous commit's time, reported with the next step

    @tfe.run
    def train(state):
        global commit_s
        follow_membership()
        end = block_end(state.step)
        while state.step < end:
            train_step(tf.constant(state.step, tf.int64))
            state.step += 1
            report(state.step, runtime.node_id, runtime.generation, runtime.membership.world_size,
                   commit_s=commit_s)
            if args.pause_every and state.step % args.pause_every == 0:
                pause(args.pause_s, args.pause_kind)
            started = time.perf_counter()
            state.commit()
            commit_s = time.perf_counter() - started
            if state.step == end:
                end = block_end(state.step)

    if args.pause_before_training:
        print(json.dumps({"paused": runtime.node_id}), flush=True)
        time.sleep(args.pause_before_training)
    train(state)
sys.stdout.flush()
os._exit(0)
