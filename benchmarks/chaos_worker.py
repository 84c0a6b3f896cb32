"""The worker of benchmarks/chaos.py: a realistic elastic loop that a driver hurts where it chooses.

Linear regression (float64, so a single-process replay can be compared) over
`strategy.distribute_elastic_dataset(tf.data.Dataset.range(...))`, a commit
every step and --compute_ms of CPU work between steps. Each step's all-reduce
also sums a histogram of the element ids trained on (`counts`, ids modulo
--bins), so the end shows whether every sample was trained on exactly once.

Control files in --control DIR (written by the driver):

* ``stop``: a global step; every worker trains until it, then prints
  {"done", "weights", "counts"} and exits 0;
* ``kill-<pid>``: a point name ("commit" or "sync"); this process SIGKILLs
  itself when it next reaches that point (in a commit, or in the state sync
  after a re-form), after writing the time to ``killed-<pid>``;
* ``pause-<pid>``: seconds; this process spins in Python (holding the GIL but
  at switch intervals) that long before its next commit, once.

Every step prints {"t", "step", "node", "generation", "world", "pid"}; every
100th also {"resources": {"threads", "rss_mb", "fds"}, "t", "node", "generation"}.
"""

import argparse
import json
import os
import signal
import sys
import time

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--control", required=True)
parser.add_argument("--global_batch", type=int, default=12)
parser.add_argument("--bins", type=int, default=1024)
parser.add_argument("--compute_ms", type=float, default=10.0)
parser.add_argument("--trace", action="store_true",
                    help="print {\"trace\": phase, \"t\"} when each phase of a recovery ends")
args = parser.parse_args()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tensorflow_elastic as tfe  # noqa: E402

FEATURES = 8
LEARNING_RATE = 0.05
ELEMENTS = 10**12  # the driver ends the job through the stop file
RESOURCES_EVERY = 100  # steps between {"resources": {"threads", "rss_mb", "fds"}} lines
PID = os.getpid()
STOP_FILE = os.path.join(args.control, "stop")
KILL_FILE = os.path.join(args.control, f"kill-{PID}")
PAUSE_FILE = os.path.join(args.control, f"pause-{PID}")


def features(i):
    """The features of element ids `i` (float64); numpy and TensorFlow alike."""
    lib = np if isinstance(i, np.ndarray) else tf.math
    k = np.arange(1, FEATURES // 2 + 1, dtype=np.float64)
    angles = i[:, None] * k[None, :] * 0.37
    if lib is np:
        return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
    return tf.concat([tf.sin(angles), tf.cos(angles)], axis=1)


TRUE_WEIGHTS = np.linspace(-1.0, 1.0, FEATURES)

runtime = tfe.init()
strategy = tfe.ElasticMultiWorkerMirroredStrategy()
batches = strategy.distribute_elastic_dataset(tf.data.Dataset.range(ELEMENTS), args.global_batch)
with strategy.scope():
    weights = tf.Variable(tf.zeros([FEATURES], tf.float64))
    counts = tf.Variable(tf.zeros([args.bins], tf.float64))


@tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
def train_step(ids):
    def replica_step(ids):
        x = features(tf.cast(ids, tf.float64))
        y = tf.linalg.matvec(x, tf.constant(TRUE_WEIGHTS, tf.float64))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(tf.linalg.matvec(x, weights) - y)) / args.global_batch
        seen = tf.math.unsorted_segment_sum(tf.ones_like(ids, tf.float64), ids % args.bins,
                                            args.bins)
        grad, seen = tf.distribute.get_replica_context().all_reduce(
            "SUM", [tape.gradient(loss, weights), seen])
        weights.assign_sub(LEARNING_RATE * grad)
        counts.assign_add(seen)
        return loss

    return strategy.reduce("SUM", strategy.run(replica_step, args=(ids,)), axis=None)


def chaos_point(name: str) -> None:
    """Dies here (SIGKILL) when the driver asked for this point."""
    try:
        with open(KILL_FILE) as f:
            point = f.read().strip()
    except FileNotFoundError:
        return
    if point == name:
        with open(os.path.join(args.control, f"killed-{PID}.tmp"), "w") as f:
            f.write(f"{time.time()!r} {name}")
        os.rename(os.path.join(args.control, f"killed-{PID}.tmp"),
                  os.path.join(args.control, f"killed-{PID}"))
        os.kill(PID, signal.SIGKILL)


def pause_point() -> None:
    """Holds the GIL in a pure-Python loop for the seconds in ``pause-<pid>``, once: a healthy
    member that is slow (a long step, a pause in Python) must not be taken for dead."""
    try:
        with open(PAUSE_FILE) as f:
            seconds = float(f.read())
    except (FileNotFoundError, ValueError):
        return
    os.remove(PAUSE_FILE)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(i * i for i in range(10_000))


class ChaosState(tfe.TensorFlowState):
    def commit(self):
        chaos_point("commit")
        super().commit()

    def sync(self):
        chaos_point("sync")
        super().sync()


def resources() -> dict:
    """This process's threads, resident memory (MB) and open file descriptors."""
    with open("/proc/self/statm") as f:
        rss_mb = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    return {"threads": len(os.listdir("/proc/self/task")), "rss_mb": round(rss_mb, 1),
            "fds": len(os.listdir("/proc/self/fd"))}


def stop_step() -> float:
    try:
        with open(STOP_FILE) as f:
            return int(f.read())
    except (FileNotFoundError, ValueError):
        return float("inf")


def compute(seconds: float) -> None:
    """CPU work between steps (what a real loop does: logging, metrics, host-side input)."""
    a = np.random.RandomState(PID).rand(48, 48)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = np.tanh(a @ a)


def traced(owner, name: str) -> None:
    """Prints a trace line whenever `owner.name` returns or raises."""
    inner = getattr(owner, name)

    def wrapper(*a, **k):
        try:
            return inner(*a, **k)
        finally:
            print(json.dumps({"trace": name, "t": time.time(), "node": runtime.node_id}),
                  flush=True)

    setattr(owner, name, wrapper)


if args.trace:
    for owner, names in ((runtime, ("report_failure",)),
                         (runtime.session.client, ("join", "barrier", "synchronize")),
                         (strategy.extended, ("regroup", "broadcast_variables")),
                         (ChaosState, ("restore", "sync"))):
        for name in names:
            traced(owner, name)

state = ChaosState([weights, counts], step=0)
train_step.get_concrete_function()  # a newcomer traces while the members train
iterator = iter(batches)


@tfe.run
def train(state):
    while state.step < stop_step():
        train_step(next(iterator))
        state.step += 1
        print(json.dumps({"t": time.time(), "step": state.step, "node": runtime.node_id,
                          "generation": runtime.generation,
                          "world": runtime.membership.world_size, "pid": PID}), flush=True)
        if state.step % RESOURCES_EVERY == 0:
            print(json.dumps({"resources": resources(), "t": time.time(), "node": runtime.node_id,
                              "generation": runtime.generation}), flush=True)
        compute(args.compute_ms / 1e3)
        pause_point()
        state.commit()


train(state)
print(json.dumps({"done": True, "node": runtime.node_id, "pid": PID, "step": state.step,
                  "weights": weights.numpy().tolist(), "counts": counts.numpy().tolist()}),
      flush=True)
sys.stdout.flush()
os._exit(0)
