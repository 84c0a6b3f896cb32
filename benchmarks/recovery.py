"""Recovery benchmark of the in-process elastic strategy, on one machine, side by side.

--model picks one of benchmarks/models.py (tiny, wide, transformer, resnet50;
each trained with Adam); its settings there say how many steps each phase
runs. For each repeat it runs, with --workers local worker processes on 127.0.0.1:

* steady state: a group of stock MultiWorkerMirroredStrategy workers and a
  group of elastic-strategy workers (a commit every step), same model and data,
  both started up front and taking turns in blocks of steps (the order
  alternates), so that the drift of a shared machine hits both alike; this for
  --sets freshly started sets of groups, since a group's speed varies more
  from one start to the next than from block to block; the ratio is the median
  over all block pairs of the ratio of median step times (each set's own is
  printed too); also the ratio of CPU time per worker-step (all threads, from
  /proc); with --control, a second stock group takes its turns in the same
  sets, timed against the first the same way (an A/A ratio: how far from 1 the
  machine's noise alone puts it); also each worker's peak RSS (VmHWM) and the
  median time of an elastic commit;
* crash: SIGKILL to one worker; time to the end of the first step of the new
  generation on the survivors (the step in flight is lost and done again: the
  figure holds one whole step), and steps lost (redone); with --trace, in phases;
* growth: start with workers-1, add one; the longest step gap on existing members
  (and where it went: to the new generation's start, then the sync and the first
  step), the newcomer's state sync (its state_synced event: bytes and seconds) as a
  rate in MB/s, next to a raw loopback copy (one socket, 2 processes) of the same
  bytes measured in the same run, and the newcomer's time from its process start
  to its first contributing step (the end of its first step in the job), in
  stages: import, build, warm-up (its step traced and run alone before it joins),
  its receiving side of the sync built, join wait, state transfer, first step; with
  --prestarted the newcomer's process starts before it is needed (as a launcher could start a
  replacement ahead): it imports, builds, warms up and builds its receiving side while the
  members train, then holds before it asks to join;
  the growth starts when it is let go, and its figure is from then to its first contributing
  step (the members' pause, too, counts from then); with --fork_server the newcomer is forked
  from a fork server (launch/fork_server.py, started once at the benchmark's start, as a
  launcher's is) that imported TensorFlow and the package: its start is the fork request;
* leave: SIGTERM to one worker; the longest step gap on the survivors.

Prints progress, then a table, and as its last line the JSON summary:
{"model", "snapshot_every", "fork_server", "state_mb", "overhead_ratio", "overhead_cpu_ratio", "rss_ratio", "commit_ms_median",
 "recovery_s_median", "growth_pause_s_median", "newcomer_start_s_median",
 "newcomer_from_need_s_median",
 "leave_pause_s_median", "sync_mb_s_median",
 "loopback_mb_s_median", "lost_steps_max", "lost_steps_max_growth_leave"}, plus
"control_ratio" with --control.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

from harness import WAIT_S, Orchestrator, Process, child_env, free_port, gaps, tf_config

from tensorflow_elastic.launch.preloaded import ForkServer
from tensorflow_elastic.observability.events import (GENERATION_START, STATE_RESTORED,
                                                      STATE_SYNCED, read_events)

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recovery_worker.py")


class Settings(NamedTuple):
    """A model's global batch and how long each phase runs for it (bigger models: fewer steps)."""

    global_batch: int
    warmup_steps: int
    block_steps: int
    disruption_steps: int  # steps before and after a crash, growth or leave


SETTINGS = {
    "tiny": Settings(global_batch=48, warmup_steps=40, block_steps=150, disruption_steps=20),
    "wide": Settings(global_batch=48, warmup_steps=15, block_steps=40, disruption_steps=10),
    "transformer": Settings(global_batch=6, warmup_steps=10, block_steps=25, disruption_steps=8),
    "resnet50": Settings(global_batch=6, warmup_steps=6, block_steps=12, disruption_steps=5),
}


def model_flags(model: str, snapshot_every: int = 1) -> tuple[str, ...]:
    """The worker's flags for `model` and (elastic workers) the state's commit policy."""
    return ("--model", model, "--global_batch", str(SETTINGS[model].global_batch),
            "--snapshot_every", str(snapshot_every))


def start_orchestrator(heartbeat_timeout: float = 5.0) -> Orchestrator:
    """The orchestrator of these workers: a last call of 0.5 s, the given heartbeat timeout."""
    return Orchestrator("--last_call", "0.5", "--heartbeat_timeout", str(heartbeat_timeout))


def elastic_workers(orchestrator: Orchestrator, count: int, run_id: str, steps: int,
                    min_nodes: int, max_nodes: int, events_file: str,
                    flags: tuple[str, ...] = (), fork_server=None) -> list[Process]:
    env = child_env(TFE_RDZV_ENDPOINT=orchestrator.endpoint, TFE_RUN_ID=run_id,
                    TFE_MIN_NODES=str(min_nodes), TFE_MAX_NODES=str(max_nodes),
                    TFE_EVENTS_FILE=events_file)
    return [Process([sys.executable, WORKER, "--mode", "elastic", "--steps", str(steps), *flags],
                    env, fork_server=fork_server) for _ in range(count)]


def stock_workers(count: int, steps: int,
                  flags: tuple[str, ...] = ()) -> list[Process]:
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(count)]
    return [Process([sys.executable, WORKER, "--mode", "mwms", "--steps", str(steps), *flags],
                    child_env(TF_CONFIG=tf_config(addresses, i)))
            for i in range(count)]


def step_gaps(records: list[dict], since: float) -> list[float]:
    """Gaps between consecutive steps from the last step before `since` on."""
    times = [r["t"] for r in records]
    start = max([i for i, t in enumerate(times) if t < since], default=0)
    return gaps(times[start:])


def run_block(group: list[Process], steps: int, skip: int = 5) -> tuple[float, float]:
    """Runs `steps` more steps on every worker of `group`: (the median step time, all workers
    pooled; CPU seconds per worker-step).

    The first `skip` intervals of the block (the workers starting at slightly
    different times) are left out of the step time.
    """
    first = group[0].last_step()
    cpu_before = sum(p.cpu_seconds() for p in group)
    for p in group:
        p.send(str(steps))
    for p in group:
        p.wait_for(lambda p=p: p.last_step() >= first + steps, "a block of steps", peers=group)
    cpu_per_step = (sum(p.cpu_seconds() for p in group) - cpu_before) / (len(group) * steps)
    intervals = []
    skip = min(skip, steps // 3)  # short blocks (large models) keep most of their steps
    for p in group:
        intervals += gaps([r["t"] for r in p.records if r["step"] > first][skip:])
    return statistics.median(intervals), cpu_per_step


class Steady(NamedTuple):
    """What one steady-state set measured."""

    pairs: list[tuple[tuple[float, float], tuple[float, float]]]  # (stock, elastic) run_block()s
    control_pairs: list[tuple[tuple[float, float], tuple[float, float]]]  # (stock, second stock)
    stock_rss_mb: list[float]  # each worker's peak RSS
    elastic_rss_mb: list[float]
    commit_s: list[float]  # the elastic workers' commit times after the warm-up


def steady_state(workers: int, pairs: int, model: str, tmp: str, control: bool = False,
                 snapshot_every: int = 1) -> Steady:
    """`pairs` rounds in which a stock and an elastic group (with `control`, also a second stock
    group: its ratio to the first shows the noise floor) each run a block, taking turns.

    The order rotates from round to round (and runs backwards every other cycle), so no group
    always runs first or right after the same other one.
    """
    settings = SETTINGS[model]
    orchestrator = start_orchestrator()
    flags = ("--blocks", *model_flags(model, snapshot_every))
    groups = {"stock": stock_workers(workers, 10**9, flags),
              "elastic": elastic_workers(orchestrator, workers, "steady", 10**9, workers,
                                         workers, os.path.join(tmp, "steady.jsonl"), flags)}
    if control:
        groups["control"] = stock_workers(workers, 10**9, flags)
    names = list(groups)
    everyone = [p for group in groups.values() for p in group]
    try:
        for group in groups.values():
            run_block(group, settings.warmup_steps)
        rounds = []
        for i in range(pairs):
            order = names[i % len(names):] + names[:i % len(names)]
            if (i // len(names)) % 2:
                order.reverse()
            rounds.append({name: run_block(groups[name], settings.block_steps)
                           for name in order})
        measured = Steady([(r["stock"], r["elastic"]) for r in rounds],
                          [(r["stock"], r["control"]) for r in rounds] if control else [],
                          [p.peak_rss_mb() for p in groups["stock"]],
                          [p.peak_rss_mb() for p in groups["elastic"]],
                          [r["commit_s"] for p in groups["elastic"] for r in p.records
                           if r["step"] > settings.warmup_steps + 1 and r.get("commit_s")])
        for p in everyone:
            p.send("0")
        for p in everyone:
            p.wait_for(lambda p=p: p.proc.poll() is not None, "the workers to finish")
        return measured
    finally:
        for p in everyone:
            p.stop()
        orchestrator.stop()


def ratios_of(pairs: list[tuple[tuple[float, float], tuple[float, float]]]) -> tuple[float, float]:
    """(the median wall-time ratio, the median CPU ratio) of (stock, other) block pairs."""
    return (statistics.median(o / s for (s, _), (o, _) in pairs),
            statistics.median(o / s for (_, s), (_, o) in pairs))


def disruption(kind: str, workers: int, model: str, tmp: str, repeat: int,
               snapshot_every: int = 1, trace: bool = False, prestarted: bool = False,
               fork_server=None) -> dict:
    """One crash, growth or leave scenario; returns its measurements."""
    settings = SETTINGS[model]
    orchestrator = start_orchestrator()
    events_file = os.path.join(tmp, f"{kind}-{repeat}.jsonl")
    initial = workers - 1 if kind == "growth" else workers
    flags = model_flags(model, snapshot_every) + (("--trace",) if trace else ())
    group = elastic_workers(orchestrator, initial, f"{kind}{repeat}", 100_000,
                            min(initial, 2), workers, events_file, flags)
    try:
        for p in group:
            p.wait_for(lambda p=p: p.last_step() >= settings.warmup_steps, "warm-up steps")
        if kind == "growth":
            t0 = started = time.time()
            group += elastic_workers(orchestrator, 1, f"{kind}{repeat}", 100_000, 2, workers,
                                     events_file,
                                     flags + (("--hold_before_join",) if prestarted else ()),
                                     fork_server)
            existing = group[:-1]
            newcomer = group[-1]
            if prestarted:
                newcomer.wait_for(lambda: "held" in _marks(newcomer), "the newcomer's warm-up")
                t0 = time.time()
                newcomer.send("go")
            newcomer.wait_for(lambda: newcomer.last_step() > 0, "the newcomer's first step")
            target_step = max(p.last_step() for p in existing) + settings.disruption_steps
            for p in existing:
                p.wait_for(lambda p=p: p.last_step() >= target_step, "steps after the growth")
            pause = max(max(step_gaps(p.records, t0)) for p in existing)
            if trace:
                print(growth_trace(existing, newcomer, t0), flush=True)
            synced = [e for e in read_events(events_file, event=STATE_SYNCED)
                      if e["node"] == newcomer.records[-1]["node"]]
            return {"pause_s": pause, "lost_steps": _lost_steps(existing, events_file),
                    "sync_s": synced[-1]["seconds"], "sync_mb": synced[-1]["bytes"] / 2**20,
                    "sync_mb_s": synced[-1]["bytes"] / 2**20 / synced[-1]["seconds"],
                    **_members_in_growth(existing, events_file),
                    **_newcomer_start(newcomer, started, t0, events_file),
                    "loopback_mb_s": loopback_copy_mb_s(synced[-1]["bytes"])}
        victim = group[-1]
        survivors = group[:-1]
        before = max(p.last_step() for p in survivors)
        # The first generation may already have grown while the workers started.
        generation = max(r["generation"] for p in survivors for r in p.records)
        t0 = time.time()
        victim.stop(signal.SIGKILL if kind == "crash" else signal.SIGTERM)
        for p in survivors:
            p.wait_for(lambda p=p: any(r["generation"] > generation for r in p.records),
                       "a step of the new generation")
            p.wait_for(lambda p=p: p.last_step() >= before + settings.disruption_steps,
                       "steps after the change")
        first_new = min(r["t"] for p in survivors for r in p.records
                        if r["generation"] > generation)
        pause = max(max(step_gaps(p.records, t0)) for p in survivors)
        phases = {}
        if trace and kind == "crash":
            phases = crash_phases(survivors, t0, generation)
            print(crash_trace(survivors, t0), flush=True)
        return {"recovery_s": first_new - t0, "pause_s": pause,
                "lost_steps": _lost_steps(survivors, events_file), **phases}
    finally:
        for p in group:
            p.stop()
        orchestrator.stop()


def timed_lines(worker: Process) -> list[tuple[str, str, float]]:
    """The worker's "mark NAME TIME" and "trace NAME TIME" lines so far, as (kind, name, time)."""
    found = getattr(worker, "timed", [])
    while not worker.lines.empty():
        line = worker.lines.get_nowait().split()
        if len(line) == 3 and line[0] in ("mark", "trace"):
            found.append((line[0], line[1], float(line[2])))
    worker.timed = found
    return found


def growth_trace(existing: list[Process], newcomer: Process, since: float) -> str:
    """With --trace: each worker's stages of the growth, in ms after the end of the existing
    members' last step before it."""
    last = max(max(r["t"] for r in p.records if r["t"] < min(
        (t for kind, _, t in timed_lines(p) if kind == "trace" and t > since),
        default=float("inf"))) for p in existing)
    rows = []
    for label, p in [*((f"member {p.records[-1]['node']}", p) for p in existing),
                     ("newcomer", newcomer)]:
        stages = [f"{name} {(t - last) * 1e3:.0f}" for kind, name, t in timed_lines(p)
                  if kind == "trace" and t > last - 1]
        first = min((r["t"] for r in p.records if r["t"] > last), default=None)
        step = "" if first is None else f", first step {(first - last) * 1e3:.0f}"
        rows.append(f"  {label}: " + ", ".join(stages) + step)
    before = statistics.median(g for p in existing for g in gaps(
        [r["t"] for r in p.records if r["t"] <= last][-20:]))
    return (f"growth stages (ms after the members' last step before it; their steps before it: "
            f"{before * 1e3:.0f} ms):\n" + "\n".join(rows))


def crash_trace(survivors: list[Process], killed: float) -> str:
    """With --trace: each survivor's stages of a crash's recovery, in ms after the kill."""
    rows = []
    for p in survivors:
        before = max(r["t"] for r in p.records if r["t"] < killed)
        stages = [f"{name} {(t - killed) * 1e3:.0f}" for kind, name, t in timed_lines(p)
                  if kind == "trace" and t > killed]
        first = min(r["t"] for r in p.records if r["t"] > killed)
        rows.append(f"  member {p.records[-1]['node']}: last step ended "
                    f"{(before - killed) * 1e3:.0f}, " + ", ".join(stages)
                    + f", first step {(first - killed) * 1e3:.0f}")
    return "crash stages (ms after the kill):\n" + "\n".join(rows)


def crash_phases(survivors: list[Process], killed: float, generation: int) -> dict:
    """With --trace: where a crash's recovery went, from the kill to the end of the first step of
    the new generation, on the survivor that ended that step first: detection (the kill to the
    failed step's error reaching the loop), going back (the failure reported, the last commit
    restored), re-form (the join, the server update, the new generation's barrier), the state
    sync, and the first step; and the steps' own time (the median gap) before the kill and after
    the first step of the new generation."""
    def first_step(p):
        return min(r["t"] for r in p.records if r["generation"] > generation)

    p = min(survivors, key=first_step)
    traces = [(name, t) for kind, name, t in timed_lines(p) if kind == "trace" and t > killed]

    def first(name, after=killed):
        return min(t for n, t in traces if n == name and t >= after)

    detected = first("_recover:in")
    restored = first("restore", detected)
    synced = first("sync", restored)
    formed = max(t for n, t in traces if n == "synchronize" and restored <= t <= synced)
    steps = [r["t"] for r in p.records if r["t"] < killed][-11:]
    after = [r["t"] for r in p.records if r["generation"] > generation]
    return {"crash_detect_s": detected - killed, "crash_go_back_s": restored - detected,
            "crash_reform_s": formed - restored, "crash_sync_s": synced - formed,
            "crash_first_step_s": first_step(p) - synced,
            "crash_step_before_s": statistics.median(gaps(steps)),
            "crash_step_after_s": statistics.median(gaps(after))}


def _marks(worker: Process) -> dict[str, float]:
    """The worker's "mark NAME TIME" lines so far, by name."""
    return {name: t for kind, name, t in timed_lines(worker) if kind == "mark"}


def _newcomer_start(newcomer: Process, started: float, needed: float, events_file: str) -> dict:
    """The newcomer's time from its process start to its first contributing step (the end of its
    first step in the job: its gradients are part of that step's all-reduce), in stages: import,
    build (registration, strategy, model), warm-up (its step traced and run alone), join wait
    (its receiving side of the sync built, then the wait for the generation that admits it),
    state transfer (the sync), first step. `needed`: when it was let go (a pre-started
    newcomer; else its start): its time to the first step from then, and held, the time it
    waited warmed up, are counted apart."""
    marks = _marks(newcomer)
    node = newcomer.records[0]["node"]
    joined = min(e["time"] for e in read_events(events_file, event=GENERATION_START)
                 if e["node"] == node)
    synced = min(e["time"] for e in read_events(events_file, event=STATE_SYNCED)
                 if e["node"] == node)
    first_step = newcomer.records[0]["t"]
    warmed = marks.get("warmed", marks["built"])
    prepared = marks.get("prepared", warmed)
    asked = max(prepared, needed)  # when it asked to join
    return {"newcomer_s": first_step - started, "newcomer_from_need_s": first_step - needed,
            "newcomer_import_s": marks["imported"] - started,
            "newcomer_build_s": marks["built"] - marks["imported"],
            "newcomer_warm_up_s": warmed - marks["built"],
            "newcomer_prepare_s": prepared - warmed, "newcomer_held_s": asked - prepared,
            "newcomer_join_wait_s": joined - asked,
            "newcomer_transfer_s": synced - joined, "newcomer_first_step_s": first_step - synced}


def _members_in_growth(existing: list[Process], events_file: str) -> dict:
    """Where the existing members' longest gap went: from the end of their last step before the
    growth to the start of the new generation (the vote's commit, the change barrier, the join,
    the server update, the generation's barrier), and from there to the end of their first
    step with the newcomer (the state sync, the step); the longest of the members each."""
    starts = list(read_events(events_file, event=GENERATION_START))
    reform, after = [], []
    for p in existing:
        node = p.records[-1]["node"]
        began = max(e["time"] for e in starts if e["node"] == node)
        reform.append(began - max(r["t"] for r in p.records if r["t"] < began))
        after.append(min(r["t"] for r in p.records if r["t"] > began) - began)
    return {"members_reform_s": max(reform), "members_sync_and_step_s": max(after)}


_LOOPBACK_RECEIVER = """
import socket, sys
size = int(sys.argv[2])
with socket.create_connection(("127.0.0.1", int(sys.argv[1]))) as s:
    buffer = memoryview(bytearray(size))
    received = 0
    while received < size:
        received += s.recv_into(buffer[received:])
    s.sendall(b"k")
"""


def loopback_copy_mb_s(size: int, repeats: int = 3) -> float:
    """The raw rate of moving `size` bytes (at least 64 MB) over one loopback TCP connection to
    another process (into a preallocated buffer): the median of `repeats` copies, in MB/s."""
    size = max(size, 64 << 20)
    payload = memoryview(bytearray(os.urandom(1 << 20)) * (size >> 20))
    rates = []
    for _ in range(repeats):
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            receiver = subprocess.Popen([sys.executable, "-c", _LOOPBACK_RECEIVER,
                                         str(server.getsockname()[1]), str(len(payload))])
            try:
                server.settimeout(WAIT_S)
                connection, _ = server.accept()
                with connection:
                    connection.settimeout(WAIT_S)
                    started = time.perf_counter()
                    connection.sendall(payload)
                    if connection.recv(1) != b"k":
                        raise RuntimeError("the loopback receiver did not acknowledge the copy")
                    rates.append(len(payload) / 2**20 / (time.perf_counter() - started))
            finally:
                receiver.wait(timeout=WAIT_S)
    return statistics.median(rates)


def _lost_steps(workers: list[Process], events_file: str) -> int:
    """Steps whose work was thrown away: completed steps done again after a rollback,
    plus the step in flight when a rollback (a state_restored event) happened."""
    redone = 0
    for p in workers:
        steps = [r["step"] for r in p.records]
        for before, after in zip(steps, steps[1:]):
            if after <= before:
                redone = max(redone, before - after + 1)
    rolled_back = any(read_events(events_file, event=STATE_RESTORED)) \
        if os.path.exists(events_file) else False
    return redone + (1 if rolled_back else 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=3, help="worker processes (default 3)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each scenario (default 5)")
    parser.add_argument("--sets", type=int, default=3,
                        help="steady state: fresh sets of groups of workers per repeat "
                        "(default 3); a group's speed varies from one start to the next by more "
                        "than from one block to the next")
    parser.add_argument("--control", action="store_true",
                        help="steady state: a second stock group takes its turns in every set, "
                        "timed against the first: its ratio, ideally 1, shows the machine's "
                        "noise")
    parser.add_argument("--pairs", type=int, default=4,
                        help="steady state: rounds per set of groups, each group running one "
                        "block per round (default 4)")
    parser.add_argument("--model", default="tiny", choices=sorted(SETTINGS),
                        help="the model (benchmarks/models.py; default tiny)")
    parser.add_argument("--snapshot_every", type=int, default=1,
                        help="the elastic workers' commit policy: a snapshot every N commits "
                        "(default 1)")
    parser.add_argument("--skip", nargs="*", default=[],
                        choices=["steady", "crash", "growth", "leave"],
                        help="phases to leave out (default none)")
    parser.add_argument("--prestarted", action="store_true",
                        help="growth: start the newcomer's process ahead (it imports, builds and "
                        "warms up while the members train, then holds) and time the growth from "
                        "when it is let go")
    parser.add_argument("--fork_server", action="store_true",
                        help="growth: fork the newcomer from a fork server started at the "
                        "benchmark's start (tfelastic-run --fork_server's way) instead of "
                        "starting a fresh Python")
    parser.add_argument("--trace", action="store_true",
                        help="growth: print when each stage of the change returned on every "
                        "worker (join, barriers, exchange, regroup, sync, broadcast); crash: "
                        "the same on the survivors, and the recovery in phases (detection, "
                        "going back, re-form, state sync, first step)")
    args = parser.parse_args(argv)
    if args.workers < 2:
        parser.error("--workers must be at least 2")
    results: dict[str, list] = {"stock_s": [], "elastic_s": [], "ratio": [], "cpu_ratio": [],
                                "control_ratio": [], "set_ratios": [], "set_control_ratios": [],
                                "stock_rss_mb": [], "elastic_rss_mb": [],
                                "commit_s": [], "crash": [], "growth": [], "leave": []}
    kinds = [kind for kind in ("crash", "growth", "leave") if kind not in args.skip]
    fork_server = ForkServer(child_env()) if args.fork_server else None
    with tempfile.TemporaryDirectory(prefix="tfe-recovery-") as tmp:
        for repeat in range(args.repeats):
            if "steady" not in args.skip:
                _steady_repeat(args, tmp, repeat, results)
            for kind in kinds:
                r = disruption(kind, args.workers, args.model, tmp, repeat, args.snapshot_every,
                               args.trace, args.prestarted, fork_server)
                results[kind].append(r)
                print(f"[{repeat + 1}/{args.repeats}] {kind}: " +
                      ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                for k, v in r.items()), flush=True)
    if fork_server is not None:
        fork_server.close()
    _report(args, results)
    return 0


def _steady_repeat(args: argparse.Namespace, tmp: str, repeat: int,
                   results: dict[str, list]) -> None:
    """One repeat of the steady state (--sets sets of groups), added to `results`."""
    sets = []
    for number in range(args.sets):
        steady = steady_state(args.workers, args.pairs, args.model, tmp, control=args.control,
                              snapshot_every=args.snapshot_every)
        sets.append(steady)
        results["set_ratios"].append(ratios_of(steady.pairs)[0])
        control = ""
        if steady.control_pairs:
            results["set_control_ratios"].append(ratios_of(steady.control_pairs)[0])
            control = f", control {results['set_control_ratios'][-1]:.3f}"
        print(f"[{repeat + 1}/{args.repeats}] set {number + 1}/{args.sets}: ratio "
              f"{results['set_ratios'][-1]:.3f}{control}", flush=True)
    pairs = [pair for steady in sets for pair in steady.pairs]
    stock_s = statistics.median(s for (s, _), _ in pairs)
    elastic_s = statistics.median(e for _, (e, _) in pairs)
    ratio, cpu_ratio = ratios_of(pairs)
    results["stock_s"].append(stock_s)
    results["elastic_s"].append(elastic_s)
    results["ratio"].append(ratio)
    results["cpu_ratio"].append(cpu_ratio)
    results["stock_rss_mb"].append(statistics.median(m for st in sets for m in st.stock_rss_mb))
    results["elastic_rss_mb"].append(statistics.median(m for st in sets
                                                       for m in st.elastic_rss_mb))
    results["commit_s"].append(statistics.median(c for st in sets for c in st.commit_s))
    print(f"[{repeat + 1}/{args.repeats}] steady state: stock {stock_s * 1e3:.2f} ms/step, "
          f"elastic {elastic_s * 1e3:.2f} ms/step, ratio {ratio:.3f}, CPU per "
          f"worker-step ratio {cpu_ratio:.3f}, peak RSS stock {results['stock_rss_mb'][-1]:.0f} "
          f"MB elastic {results['elastic_rss_mb'][-1]:.0f} MB, commit "
          f"{results['commit_s'][-1] * 1e3:.3f} ms", flush=True)
    if args.control:
        control = [pair for steady in sets for pair in steady.control_pairs]
        results["control_ratio"].append(ratios_of(control)[0])
        print(f"[{repeat + 1}/{args.repeats}] control (stock vs stock): ratio "
              f"{results['control_ratio'][-1]:.3f}", flush=True)


def _report(args: argparse.Namespace, results: dict[str, list]) -> None:
    """The table (median, min, max of the repeats) and the JSON summary line."""
    med = statistics.median
    rows = [("stock MWMS step (ms)", [x * 1e3 for x in results["stock_s"]]),
            ("elastic step (ms)", [x * 1e3 for x in results["elastic_s"]]),
            ("overhead ratio", results["ratio"]),
            ("CPU per worker-step ratio", results["cpu_ratio"]),
            ("overhead ratio, each set", results["set_ratios"]),
            ("control ratio (stock/stock)", results["control_ratio"]),
            ("control ratio, each set", results["set_control_ratios"]),
            ("peak RSS stock (MB)", results["stock_rss_mb"]),
            ("peak RSS elastic (MB)", results["elastic_rss_mb"]),
            ("RSS ratio", [e / s for s, e in zip(results["stock_rss_mb"],
                                                 results["elastic_rss_mb"])]),
            ("commit (ms)", [x * 1e3 for x in results["commit_s"]]),
            ("crash recovery (s)", [r["recovery_s"] for r in results["crash"]]),
            ("  detection (s)", [r["crash_detect_s"] for r in results["crash"] if args.trace]),
            ("  go back (report, restore) (s)", [r["crash_go_back_s"] for r in results["crash"]
                                                 if args.trace]),
            ("  re-form (s)", [r["crash_reform_s"] for r in results["crash"] if args.trace]),
            ("  state sync (s)", [r["crash_sync_s"] for r in results["crash"] if args.trace]),
            ("  first step (s)", [r["crash_first_step_s"] for r in results["crash"]
                                  if args.trace]),
            ("  a step before the crash (s)", [r["crash_step_before_s"] for r in results["crash"]
                                               if args.trace]),
            ("  a step after the first (s)", [r["crash_step_after_s"] for r in results["crash"]
                                              if args.trace]),
            ("growth pause (s)", [r["pause_s"] for r in results["growth"]]),
            ("leave pause (s)", [r["pause_s"] for r in results["leave"]]),
            ("newcomer's sync (s)", [r["sync_s"] for r in results["growth"]]),
            ("members: to the generation (s)", [r["members_reform_s"] for r in results["growth"]]),
            ("members: sync and step (s)", [r["members_sync_and_step_s"]
                                            for r in results["growth"]]),
            ("newcomer start to 1st step (s)", [r["newcomer_s"] for r in results["growth"]]),
            ("newcomer needed to 1st step (s)", [r["newcomer_from_need_s"]
                                                 for r in results["growth"] if args.prestarted]),
            ("  import (s)", [r["newcomer_import_s"] for r in results["growth"]]),
            ("  build (s)", [r["newcomer_build_s"] for r in results["growth"]]),
            ("  warm-up (trace, step) (s)", [r["newcomer_warm_up_s"] for r in results["growth"]]),
            ("  receiving side built (s)", [r["newcomer_prepare_s"] for r in results["growth"]]),
            ("  held, ready (s)", [r["newcomer_held_s"] for r in results["growth"]
                                   if args.prestarted]),
            ("  join wait (s)", [r["newcomer_join_wait_s"] for r in results["growth"]]),
            ("  state transfer (s)", [r["newcomer_transfer_s"] for r in results["growth"]]),
            ("  first step (s)", [r["newcomer_first_step_s"] for r in results["growth"]]),
            ("sync rate (MB/s)", [r["sync_mb_s"] for r in results["growth"]]),
            ("loopback copy (MB/s)", [r["loopback_mb_s"] for r in results["growth"]]),
            ("lost steps", [r["lost_steps"] for kind in ("crash", "growth", "leave")
                            for r in results[kind]])]
    print(f"\nmodel {args.model}, {args.workers} workers, {args.repeats} repeat(s), a snapshot "
          f"every {args.snapshot_every} commit(s)"
          f"{', the newcomer forked from a fork server' if args.fork_server else ''}")
    print(f"{'metric':<30}{'median':>10}{'min':>10}{'max':>10}")
    for name, values in rows:
        if values:
            print(f"{name:<30}{med(values):>10.3f}{min(values):>10.3f}{max(values):>10.3f}")

    def median_of(values, digits=4):
        return round(med(values), digits) if values else None

    growth = results["growth"]
    lost = {kind: [r["lost_steps"] for r in results[kind]] for kind in ("crash", "growth", "leave")}
    summary = {
        "model": args.model,
        "snapshot_every": args.snapshot_every,
        "fork_server": args.fork_server,
        "state_mb": median_of([r["sync_mb"] for r in growth], 2),
        "overhead_ratio": median_of(results["ratio"]),
        "overhead_cpu_ratio": median_of(results["cpu_ratio"]),
        "rss_ratio": median_of([e / s for s, e in zip(results["stock_rss_mb"],
                                                      results["elastic_rss_mb"])]),
        "commit_ms_median": median_of([x * 1e3 for x in results["commit_s"]]),
        "recovery_s_median": median_of([r["recovery_s"] for r in results["crash"]]),
        "growth_pause_s_median": median_of([r["pause_s"] for r in growth]),
        "newcomer_start_s_median": median_of([r["newcomer_s"] for r in growth], 3),
        "newcomer_from_need_s_median": median_of([r["newcomer_from_need_s"] for r in growth], 3),
        "leave_pause_s_median": median_of([r["pause_s"] for r in results["leave"]]),
        "sync_mb_s_median": median_of([r["sync_mb_s"] for r in growth], 1),
        "loopback_mb_s_median": median_of([r["loopback_mb_s"] for r in growth], 1),
        "lost_steps_max": max((x for v in lost.values() for x in v), default=None),
        "lost_steps_max_growth_leave": max(lost["growth"] + lost["leave"], default=None),
    }
    if args.control:
        summary["control_ratio"] = median_of(results["control_ratio"])
    print(json.dumps(summary))


if __name__ == "__main__":
    sys.exit(main())
