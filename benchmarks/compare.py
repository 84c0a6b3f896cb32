"""Crash recovery, three ways, on the same scenario and machine.

Every scenario trains the same model with the same step function
(benchmarks/recovery_worker.py) on --workers local processes on 127.0.0.1,
waits for --warmup steps and half of --save_every more (halfway between two
checkpoints of the MWMS ways), SIGKILLs the worker with the highest node id (never
the chief) and measures

* recovery_s: from the SIGKILL to the first training step completed after it
  (workers print a timestamped line per step; "after it" means a step of a new
  generation or of a new process);
* lost_steps: steps completed before the SIGKILL that were done again after it.

The three ways:

* inprocess: `tfelastic-run --elastic_mode in_process` with the elastic worker
  (`tfe.init()`, ElasticMultiWorkerMirroredStrategy, a commit every step): the
  survivors re-form inside their processes;
* restart: `tfelastic-run --elastic_mode restart` with the stock
  MultiWorkerMirroredStrategy worker (TF_CONFIG, checkpoint resume): the agent
  restarts every worker with a new TF_CONFIG (the mode is named because the
  worker file also contains the elastic mode, which auto-detection would see);
* stock: the same MWMS worker on fixed ports and a fixed TF_CONFIG, under a
  tiny supervisor here that restarts every worker when one fails.

MWMS workers save a checkpoint every --save_every steps. Supervisors poll every
--poll_s seconds. Prints progress, a table, and as its last line the JSON
summary {"inprocess_recovery_s", "restart_recovery_s", "stock_recovery_s",
"speedup_vs_stock", ...}: medians over --repeats, speedup = stock / inprocess.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time

from harness import (WAIT_S, Job, LauncherProcess, Process, exit_on_sigterm, free_port,
                     tf_config, wait_until)
from recovery import WORKER

STEPS = 1_000_000  # runs are stopped after the measurement
KINDS = ("inprocess", "restart", "stock")


class LauncherJob(Job):
    def __init__(self, kind: str, workers: int, tmp: str, poll_s: float, save_every: int):
        super().__init__()
        if kind == "inprocess":
            nnodes, mode, script = f"{workers - 1}:{workers}", "in_process", ["--mode", "elastic"]
        else:
            nnodes, mode = str(workers), "restart"
            script = ["--mode", "mwms", "--backup_dir", os.path.join(tmp, "backup"),
                      "--save_every", str(save_every)]
        self.launcher = LauncherProcess(
            [sys.executable, "-m", "tensorflow_elastic.distributed.launch", "--standalone",
             f"--nworkers={nnodes}", f"--nproc_per_node={workers}", f"--elastic_mode={mode}",
             f"--monitor_interval={poll_s}", "--stop_timeout=5",
             f"--events_file={os.path.join(tmp, 'events.jsonl')}",
             WORKER, *script, "--steps", str(STEPS)], self.env)

    def records(self) -> list[dict]:
        return list(self.launcher.records)

    def close(self) -> None:
        self.launcher.stop(signal.SIGTERM)
        super().close()


class StockJob(Job):
    """Stock MWMS on fixed ports; a supervisor thread restarts every worker after one fails."""

    def __init__(self, workers: int, tmp: str, poll_s: float, save_every: int):
        super().__init__()
        self.addresses = [f"127.0.0.1:{free_port()}" for _ in range(workers)]
        self.argv = [sys.executable, WORKER, "--mode", "mwms", "--steps", str(STEPS),
                     "--backup_dir", os.path.join(tmp, "backup"), "--save_every", str(save_every)]
        self.poll_s = poll_s
        self.started: list[Process] = []
        self.group = self._start_group()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._supervise, daemon=True)
        self._thread.start()

    def _start_group(self) -> list[Process]:
        group = []
        for index in range(len(self.addresses)):
            group.append(Process(self.argv, dict(self.env,
                                                 TF_CONFIG=tf_config(self.addresses, index))))
        self.started += group
        return group

    def _supervise(self) -> None:
        while not self._done.wait(self.poll_s):
            if any(p.proc.poll() not in (None, 0) for p in self.group):
                for p in self.group:
                    p.stop(signal.SIGTERM)
                if not self._done.is_set():
                    self.group = self._start_group()

    def records(self) -> list[dict]:
        return [r for p in list(self.started) for r in list(p.records)]

    def close(self) -> None:
        self._done.set()
        self._thread.join(timeout=WAIT_S)
        for p in self.started:
            p.stop()
        super().close()


def scenario(kind: str, args: argparse.Namespace, tmp: str) -> dict:
    """One crash: warm up, SIGKILL a non-chief worker, wait for recovery; its measurements."""
    os.makedirs(tmp)
    if kind == "stock":
        job: Job = StockJob(args.workers, tmp, args.poll_s, args.save_every)
    else:
        job = LauncherJob(kind, args.workers, tmp, args.poll_s, args.save_every)
    try:
        # Halfway between two checkpoints: the MWMS ways lose what an average failure loses.
        kill_step = args.warmup + args.save_every // 2

        def warm() -> bool:
            return len({r["pid"] for r in job.records() if r["step"] >= kill_step}) >= args.workers

        wait_until(warm, f"{kill_step} steps on {args.workers} workers")
        newest = max(job.records(), key=lambda r: (r["node"], r["t"]))
        t0 = time.time()
        job.send_signal(newest["pid"], signal.SIGKILL)
        time.sleep(0.5)  # step lines printed before the kill have arrived by now
        before = [r for r in job.records() if r["t"] <= t0]
        seen = {(r["pid"], r["generation"]) for r in before}

        def after() -> list[dict]:
            return [r for r in job.records()
                    if r["t"] > t0 and (r["pid"], r["generation"]) not in seen]

        wait_until(after, "the first step after the failure")
        first = min(after(), key=lambda r: r["t"])
        wait_until(lambda: max(r["step"] for r in after()) >= first["step"] + 10,
              "10 more steps after the recovery")
        last = max(r["step"] for r in before)
        # Each worker's own consecutive steps: the launcher interleaves the workers' lines.
        by_pid: dict[int, list[dict]] = {}
        for r in before:
            by_pid.setdefault(r["pid"], []).append(r)
        step_s = statistics.median(b["t"] - a["t"] for lines in by_pid.values()
                                   for a, b in zip(lines, lines[1:]) if b["step"] == a["step"] + 1)
        return {"recovery_s": first["t"] - t0, "lost_steps": max(0, last - first["step"] + 1),
                "last_step": last, "first_step": first["step"], "step_s": step_s}
    finally:
        job.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=3, help="worker processes (default 3)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each way (default 3)")
    parser.add_argument("--warmup", type=int, default=60,
                        help="steps before the kill, plus save_every / 2 (default 60)")
    parser.add_argument("--save_every", type=int, default=10,
                        help="MWMS workers' steps between checkpoints (default 10)")
    parser.add_argument("--poll_s", type=float, default=0.1,
                        help="supervisors' (agent's and stock's) check interval (default 0.1)")
    args = parser.parse_args(argv)
    if args.workers < 2:
        parser.error("--workers must be at least 2")
    exit_on_sigterm()
    results: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory(prefix="tfe-compare-") as tmp:
        for repeat in range(args.repeats):
            for kind in KINDS:
                r = scenario(kind, args, os.path.join(tmp, f"{kind}-{repeat}"))
                results[kind].append(r)
                print(f"[{repeat + 1}/{args.repeats}] {kind}: recovery {r['recovery_s']:.3f} s, "
                      f"lost steps {r['lost_steps']} (last step before the kill {r['last_step']}, "
                      f"first after it {r['first_step']}; {r['step_s'] * 1e3:.1f} ms/step)",
                      flush=True)
    med = statistics.median
    recovery = {kind: med(r["recovery_s"] for r in results[kind]) for kind in KINDS}
    lost = {kind: med(r["lost_steps"] for r in results[kind]) for kind in KINDS}
    print(f"\n{'way':<12}{'recovery s':>12}{'min':>9}{'max':>9}{'lost steps':>12}"
          f"{'vs stock':>10}")
    for kind in KINDS:
        values = [r["recovery_s"] for r in results[kind]]
        print(f"{kind:<12}{recovery[kind]:>12.3f}{min(values):>9.3f}{max(values):>9.3f}"
              f"{lost[kind]:>12g}{recovery[kind] / recovery['stock']:>10.3f}")
    print(json.dumps({
        "inprocess_recovery_s": round(recovery["inprocess"], 4),
        "restart_recovery_s": round(recovery["restart"], 4),
        "stock_recovery_s": round(recovery["stock"], 4),
        "speedup_vs_stock": round(recovery["stock"] / recovery["inprocess"], 2),
        "inprocess_lost_steps": lost["inprocess"], "restart_lost_steps": lost["restart"],
        "stock_lost_steps": lost["stock"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
