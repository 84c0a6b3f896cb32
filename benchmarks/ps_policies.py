"""Benchmark of the parameter-server policies: time to a target loss with a straggler and
with workers joining and leaving.

For each policy: one PS process and --workers worker processes on 127.0.0.1
train the same small MLP (benchmarks/ps_task.py) from the same initial
weights; worker 0 is a straggler (--slowdown times slower). The PS evaluates
the model on a fixed held-out set after every update. With the churn
scenario each policy runs once more while one more worker joins
--join_after seconds after the start and worker 1 leaves (SIGTERM, as a
preemption) --leave_after seconds after it; the table gives the parameter
versions at which they did. Reported per policy and
scenario: the parameter version (iterations of the PS) and the seconds from
the common start (every worker has built and traced its model, then all
start at once) to the target loss (--target_fraction of the initial
held-out loss, reached when the median of the last 5 evaluations is at or
below it), updates/s, the staleness of applied gradients (median, p95) and
the final loss. Then the PS ingest rate: --pushers processes push gradients
of a --params-parameter model as fast as they can; MB/s of gradients applied.

Progress goes to stderr; a table and the plot path to stdout; the last line
is the JSON summary:
{"best_async_policy": ..., "speedup_vs_synch_to_target": ..., "ingest_mb_s": ..., "policies": {...}, "churn": {...}}

    .venv/bin/python benchmarks/ps_policies.py [--workers 3] [--plot ps_policies.png]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from harness import HERE, child_env, end, free_port

from tensorflow_elastic.ps.config import POLICIES, SYNCH

TASK = os.path.join(HERE, "ps_task.py")
RUN_TIMEOUT_S = 600.0
SMOOTHING = 5


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def free_address() -> str:
    return f"127.0.0.1:{free_port()}"


def start(role: str, address: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, TASK, role, "--address", address, *args],
                            env=child_env("2", unset=("TFE_EVENTS_FILE",)), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, start_new_session=True)


def wait_for_line(proc: subprocess.Popen, prefix: str) -> None:
    for line in proc.stdout:
        if line.startswith(prefix):
            return
    raise RuntimeError(f"{proc.args[2]} exited ({proc.wait()}) before printing {prefix!r}")


def finish(procs: list[subprocess.Popen], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            end(proc)


def run_policy(policy: str, args: argparse.Namespace, workdir: str, churn: bool) -> dict:
    """One run of ``policy``: ``--workers`` workers (worker 0 the straggler); with ``churn``,
    one more joins --join_after seconds after the start and worker 1 leaves --leave_after
    seconds after it."""
    address = free_address()
    name = f"{policy}{'-churn' if churn else ''}"
    out = os.path.join(workdir, f"{name}.json")
    events_file = os.path.join(workdir, f"{name}.events")
    common = ["--policy", policy, "--iterations", str(args.iterations), "--workers",
              str(args.workers), "--step_s", str(args.step_s), "--slowdown", str(args.slowdown),
              "--learning_rate", str(args.learning_rate)]
    ps = start("ps", address, *common, "--out", out, "--events_file", events_file)
    wait_for_line(ps, "listening on")
    go_file = os.path.join(workdir, f"{name}.go")
    joining = [args.workers] if churn else []
    workers = [start("worker", address, *common, "--rank", str(rank), "--go_file", go_file,
                     *(["--straggler"] if rank == 0 else []),
                     *(["--join_after", str(args.join_after)] if rank in joining else []))
               for rank in range(args.workers + len(joining))]
    for worker in workers:
        wait_for_line(worker, "ready")
    t0 = time.time()
    open(go_file, "w").close()
    leave = threading.Timer(args.leave_after, lambda: workers[1].poll() is None
                            and workers[1].send_signal(signal.SIGTERM))
    if churn:
        leave.start()
    try:
        finish([ps], RUN_TIMEOUT_S)
    finally:
        leave.cancel()
    finish(workers, 30.0)
    with open(out) as f:
        result = json.load(f)
    return {"t0": t0, "membership": membership(events_file), **result}


def membership(events_file: str) -> dict[str, list[int]]:
    """The parameter versions at which workers joined after the start and left before the
    end (a leave the worker asked for), from the PS's events."""
    changes: dict[str, list[int]] = {"joined_at": [], "left_at": []}
    with open(events_file) as f:
        for entry in map(json.loads, f):
            if entry["event"] == "node_joined" and entry["version"] > 0:
                changes["joined_at"].append(entry["version"])
            elif entry["event"] == "node_left" and entry.get("reason") == "stop requested":
                changes["left_at"].append(entry["version"])
    return changes


def summarize(run: dict, target: float) -> dict:
    timeline = run["timeline"]
    t0 = run["t0"]
    # Reached when the median of the last SMOOTHING evaluations is at or below the target, so
    # a single lucky dip of a noisy asynchronous run does not count.
    reached = next((timeline[i] for i in range(SMOOTHING - 1, len(timeline))
                    if statistics.median(x[2] for x in timeline[i - SMOOTHING + 1:i + 1])
                    <= target), None)
    last_t, updates, final_loss = timeline[-1]
    staleness = run["stats"]["staleness"]
    return {
        "iterations_to_target": None if reached is None else reached[1],
        "time_to_target_s": None if reached is None else round(max(0.0, reached[0] - t0), 3),
        "updates_per_s": round(updates / max(1e-9, last_t - t0), 1),
        "updates": updates,
        "staleness_median": staleness["median"],
        "staleness_p95": staleness["p95"],
        "final_loss": round(final_loss, 5),
        "accepted": run["stats"]["accepted"],
        "rejected": run["stats"]["rejected_total"],
        "peak_workers": run["stats"]["peak_workers"],
        **run["membership"],
    }


def measure_ingest(args: argparse.Namespace, workdir: str) -> float:
    address = free_address()
    out = os.path.join(workdir, "ingest.json")
    ps = start("ingest_ps", address, "--params", str(args.params), "--out", out)
    wait_for_line(ps, "listening on")
    pushers = [start("pusher", address, "--params", str(args.params), "--rank", str(rank),
                     "--seconds", str(args.ingest_seconds)) for rank in range(args.pushers)]
    finish(pushers, args.ingest_seconds + 120)
    finish([ps], 60)
    with open(out) as f:
        result = json.load(f)
    landed = result["landed"]
    # Skip the first updates (connections warming up); rate over the steady part.
    steady = landed[len(landed) // 10:]
    seconds = steady[-1] - steady[0]
    return (len(steady) - 1) * result["bytes_per_gradient"] / seconds / 1e6


def plot(runs: dict[str, dict], target: float, path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for policy, run in runs.items():
        t0 = run["t0"]
        points = [(max(0.0, t - t0), loss) for t, _, loss in run["timeline"]]
        ax.plot([p[0] for p in points], [p[1] for p in points], label=policy,
                linewidth=2.2 if policy == SYNCH else 1.2)
    ax.axhline(target, color="black", linestyle=":", label="target")
    ax.set_yscale("log")
    ax.set_xlabel("seconds since the common start")
    ax.set_ylabel("held-out loss")
    ax.set_title(title)
    ax.legend(ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_table(target: float, initial: float, args: argparse.Namespace,
                tables: dict[str, dict[str, dict]]) -> None:
    print(f"target loss {target:.4g} (initial {initial:.4g} x {args.target_fraction})")
    print(f"{'scenario':9} {'policy':9} {'iters to target':>15} {'s to target':>11} "
          f"{'updates/s':>9} {'stale med':>9} {'stale p95':>9} {'final loss':>10} "
          f"{'joined at':>9} {'left at':>9}")
    for scenario, table in tables.items():
        for policy, row in table.items():
            print(f"{scenario:9} {policy:9} {str(row['iterations_to_target']):>15} "
                  f"{str(row['time_to_target_s']):>11} {row['updates_per_s']:>9} "
                  f"{str(row['staleness_median']):>9} {str(row['staleness_p95']):>9} "
                  f"{row['final_loss']:>10} {_versions(row['joined_at']):>9} "
                  f"{_versions(row['left_at']):>9}")


def _versions(versions: list[int]) -> str:
    return ",".join(map(str, versions)) or "-"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policies", default=",".join(x for x in POLICIES if x != "asynch"),
                   help="comma-separated (asynch is an alias of asypq)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--iterations", type=int, default=150, help="per worker")
    p.add_argument("--step_s", type=float, default=0.02, help="simulated compute per gradient")
    p.add_argument("--slowdown", type=float, default=3.0, help="the straggler's factor")
    p.add_argument("--learning_rate", type=float, default=0.05)
    p.add_argument("--target_fraction", type=float, default=0.04,
                   help="target loss as a fraction of the initial held-out loss")
    p.add_argument("--churn", action="store_true",
                   help="run each policy once more while a worker joins and another leaves")
    p.add_argument("--join_after", type=float, default=0.5,
                   help="with --churn: seconds after the start at which one more worker joins")
    p.add_argument("--leave_after", type=float, default=1.0,
                   help="with --churn: seconds after the start at which worker 1 leaves")
    p.add_argument("--params", type=int, default=1_000_000, help="model size for the ingest rate")
    p.add_argument("--pushers", type=int, default=4)
    p.add_argument("--ingest_seconds", type=float, default=5.0)
    p.add_argument("--ingest_repeats", type=int, default=3)
    p.add_argument("--plot", default="ps_policies.png")
    args = p.parse_args()

    workdir = tempfile.mkdtemp(prefix="ps-policies-")
    scenarios = {"straggler": False, **({"churn": True} if args.churn else {})}
    runs: dict[str, dict[str, dict]] = {scenario: {} for scenario in scenarios}
    for scenario, churn in scenarios.items():
        for policy in filter(None, args.policies.split(",")):
            log(f"policy {policy}, {scenario}: PS + {args.workers} workers ...")
            runs[scenario][policy] = run_policy(policy, args, workdir, churn)
    everything = [run for by_policy in runs.values() for run in by_policy.values()]
    initial = statistics.median(run["timeline"][0][2] for run in everything) if everything else 0.0
    target = initial * args.target_fraction
    tables = {scenario: {policy: summarize(run, target) for policy, run in by_policy.items()}
              for scenario, by_policy in runs.items()}
    if runs["straggler"]:
        plot(runs["straggler"], target, args.plot,
             f"PS policies: {args.workers} workers, one {args.slowdown:g}x straggler")

    ingest = []
    for repeat in range(args.ingest_repeats):
        ingest.append(measure_ingest(args, workdir))
        log(f"ingest run {repeat + 1}: {ingest[-1]:.0f} MB/s")

    print_table(target, initial, args, tables)
    print(f"plot: {os.path.abspath(args.plot)}")
    table = tables["straggler"]
    asynchronous = {k: v for k, v in table.items()
                    if k != SYNCH and v["time_to_target_s"] is not None}
    best = min(asynchronous, key=lambda k: asynchronous[k]["time_to_target_s"], default=None)
    synch_time = table.get(SYNCH, {}).get("time_to_target_s")
    speedup = (round(synch_time / max(1e-9, asynchronous[best]["time_to_target_s"]), 2)
               if best and synch_time else None)
    print(json.dumps({"best_async_policy": best, "speedup_vs_synch_to_target": speedup,
                      "ingest_mb_s": round(statistics.median(ingest), 1) if ingest else None,
                      "ingest_runs_mb_s": [round(x, 1) for x in ingest], "policies": table,
                      "churn": tables.get("churn", {})}))


if __name__ == "__main__":
    main()
