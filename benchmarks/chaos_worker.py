"""The worker of benchmarks/chaos.py: a training loop (chaos_workloads.py) that a driver hurts
where it chooses.

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
import faulthandler
import gc
import json
import os
import signal
import sys
import threading
import time

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--control", help="the driver's control directory (not with --replay)")
parser.add_argument("--workload", default="linear", help="a loop of chaos_workloads.py")
parser.add_argument("--replay", type=int, default=None,
                    help="train this many global batches in one plain process (no strategy) "
                    "and print the done line: the result the elastic job must equal")
parser.add_argument("--global_batch", type=int, default=12)
parser.add_argument("--bins", type=int, default=1024)
parser.add_argument("--compute_ms", type=float, default=10.0)
parser.add_argument("--local_devices", type=int, default=1,
                    help="logical CPU devices this worker drives, one replica each")
parser.add_argument("--trace", action="store_true",
                    help="print {\"trace\": phase, \"t\"} when each phase of a recovery ends, "
                    "and after every garbage collection of at least 50 ms")
args = parser.parse_args()

import tensorflow as tf  # noqa: E402

from chaos_workloads import WORKLOADS  # noqa: E402

ELEMENTS = 10**12  # the driver ends the job through the stop file
RESOURCES_EVERY = 100  # steps between {"resources": {"threads", "rss_mb", "fds"}} lines
KERAS_STEPS = 10**6  # Keras workloads: one epoch of this many global batches, ended by the stop file
PID = os.getpid()


def report_done(workload, node, step: int) -> None:
    print(json.dumps({"done": True, "node": node, "pid": PID, "step": step,
                      "weights": workload.weights(), "counts": workload.counts()}), flush=True)
    sys.stdout.flush()
    os._exit(0)


if args.replay is not None:
    workload = WORKLOADS[args.workload](tf.distribute.get_strategy(), args.global_batch,
                                        args.bins, 0.0, ".")
    if workload.custom_loop:
        for ids in tf.data.Dataset.range(args.replay * args.global_batch).batch(
                args.global_batch):
            workload.step(ids)
    else:
        workload.model.fit(workload.dataset(args.replay * args.global_batch), epochs=1,
                           verbose=0)
    report_done(workload, None, args.replay)

if args.local_devices > 1:
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration()] * args.local_devices)

import tensorflow_elastic as tfe  # noqa: E402
from tensorflow_elastic.strategy import cluster  # noqa: E402

# With --trace: fit's on_train_begin this late after its call, or its first batch this late after
# on_train_begin, dumps every thread's stack.
STACKS_AFTER_S = 3.0
STOP_FILE = os.path.join(args.control, "stop")
KILL_FILE = os.path.join(args.control, f"kill-{PID}")
PAUSE_FILE = os.path.join(args.control, f"pause-{PID}")


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


class ChaosPoints:
    """A state that dies in its commit or its sync when the driver asked for it."""

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


def report_step(step: int) -> None:
    print(json.dumps({"t": time.time(), "step": step, "node": runtime.node_id,
                      "generation": runtime.generation,
                      "world": runtime.membership.world_size, "pid": PID}), flush=True)
    if step % RESOURCES_EVERY == 0:
        print(json.dumps({"resources": resources(), "t": time.time(), "node": runtime.node_id,
                          "generation": runtime.generation}), flush=True)


_background_marks: list[tuple[str, float]] = []  # from other threads, printed by the main one


def mark(name: str, t: float | None = None) -> None:
    """Prints the trace line `name` (at `t`, by default now), after the other threads' marks."""
    while _background_marks:
        earlier, at = _background_marks.pop(0)
        print(json.dumps({"trace": earlier, "t": at, "node": runtime.node_id}), flush=True)
    print(json.dumps({"trace": name, "t": time.time() if t is None else t,
                      "node": runtime.node_id}), flush=True)


def traced_abort() -> None:
    """Notes when the collectives were aborted (on a background thread: printed at the next
    mark, so that no two lines of the output mix)."""
    inner = cluster.abort_collectives

    def wrapper(reason):
        try:
            return inner(reason)
        finally:
            _background_marks.append(("abort", time.time()))

    cluster.abort_collectives = wrapper


GC_NOTED_AFTER_S = 0.05  # Python's garbage collections at least this long are marked


def traced_collections() -> None:
    """Marks every long garbage collection ("gc<generation> <seconds>s collected <n> in
    <thread>", printed at the next mark): a collection runs the finalizers of whatever it
    frees (TensorFlow's iterators, functions, variables), in whichever thread allocated."""
    started: dict[int, float] = {}

    def timer(phase, info):
        thread = threading.get_ident()
        if phase == "start":
            started[thread] = time.perf_counter()
            return
        seconds = time.perf_counter() - started.pop(thread, time.perf_counter())
        if seconds >= GC_NOTED_AFTER_S:
            _background_marks.append((f"gc{info['generation']} {seconds:.3f}s collected "
                                      f"{info['collected']} in {threading.current_thread().name}",
                                      time.time()))

    gc.callbacks.append(timer)


def traced(owner, name: str, entered: str | None = None) -> None:
    """Prints a trace line whenever `owner.name` returns or raises (and, given `entered`, one
    named so when it is called)."""
    inner = getattr(owner, name)

    def wrapper(*a, **k):
        if entered:
            mark(entered)
        try:
            return inner(*a, **k)
        finally:
            mark(name)

    setattr(owner, name, wrapper)


runtime = tfe.init()
strategy = tfe.ElasticMultiWorkerMirroredStrategy(
    devices=[f"CPU:{i}" for i in range(args.local_devices)] if args.local_devices > 1 else None)
workload = WORKLOADS[args.workload](strategy, args.global_batch, args.bins, args.compute_ms,
                                    args.control)

if workload.custom_loop:
    class ChaosState(ChaosPoints, tfe.TensorFlowState):
        pass

    state = ChaosState(workload.variables(), step=0)
    batches = strategy.distribute_elastic_dataset(tf.data.Dataset.range(ELEMENTS),
                                                  args.global_batch)
    # One trace for every world size (with several devices, its batches are PerReplica values,
    # one slice per device), made before a newcomer joins, while the members train.
    workload.step = tf.function(workload.step.python_function,
                                input_signature=[batches.replica_element_spec])
    iterator = iter(batches)
    # A newcomer runs it once, alone, before it joins: the members do not wait for its first
    # run (with several devices, the multi-device function's instantiation).
    tfe.warm_up(lambda: workload.step(next(iterator)))
else:
    class ChaosState(ChaosPoints, tfe.KerasState):
        pass

    state = ChaosState(workload.model, workload.model.optimizer, epoch=0, batch=0)

    class BatchEnded(tf.keras.callbacks.Callback):
        """Before the elastic callback: when the batch's train function returned (with --trace,
        marked as "batch_end" at the first step of each generation; the step line follows the
        commit)."""

        t = 0.0

        def on_train_batch_end(self, batch, logs=None):
            BatchEnded.t = time.time()

    class Driven(tf.keras.callbacks.Callback):
        """After the elastic callback's commit: the step line, the driver's pause, the stop."""

        step = 0
        generation = None

        def on_train_begin(self, logs=None):
            if args.trace:
                mark("fit_begin")
                # Where every thread is, in the log, if the first batch is slow to come (a new
                # timer: the one armed at fit's call ends here).
                faulthandler.dump_traceback_later(STACKS_AFTER_S)

        def on_train_batch_begin(self, batch, logs=None):
            if args.trace and batch == 0:
                faulthandler.cancel_dump_traceback_later()
                mark("first_batch")

        def on_train_batch_end(self, batch, logs=None):
            Driven.step = step = state.batch
            if args.trace and batch == 0:
                mark("first_step")
            if args.trace and Driven.generation != runtime.generation:
                Driven.generation = runtime.generation
                mark("batch_end", BatchEnded.t)
            report_step(step)
            pause_point()
            if step >= stop_step():
                self.model.stop_training = True

if args.trace:
    for owner, names in ((runtime, ("report_failure",)),
                         (runtime.session.client, ("join", "barrier", "synchronize")),
                         (strategy.extended, ("regroup", "broadcast_variables")),
                         (ChaosState, ("restore", "sync"))):
        for name in names:
            traced(owner, name)
    # A step's (a Keras batch's) error reaches the recovery: the step raised.
    traced(runtime, "recover_in_step", entered="step_raised")
    if not workload.custom_loop:
        traced(tfe.keras.ElasticCallback, "_recover")  # the input set back: the batch runs again
    traced_abort()
    traced_collections()

if not workload.custom_loop:
    # The input is built once, before training, as docs/keras.md builds it: each `fit` call
    # (the first one, and one after a recovery outside `fit`) only distributes it.
    examples = workload.dataset(KERAS_STEPS * args.global_batch)
    # A newcomer runs a step of fit alone before it joins: the members do not wait for its
    # first run of the train function.
    tfe.keras.warm_up(workload.model, examples)


@tfe.run
def train(state):
    if workload.custom_loop:
        while state.step < stop_step():
            try:
                workload.step(next(iterator))
            except Exception:
                if args.trace:
                    mark("step_raised")
                raise
            state.step += 1
            report_step(state.step)
            workload.between_steps(state.step, PID)
            pause_point()
            state.commit()
    else:
        if args.trace:
            mark("fit")
            faulthandler.dump_traceback_later(STACKS_AFTER_S)
        workload.model.fit(examples, epochs=1, verbose=0,
                           callbacks=[BatchEnded(), tfe.keras.ElasticCallback(state), Driven()])


train(state)
report_done(workload, runtime.node_id, state.step if workload.custom_loop else Driven.step)
