"""How long training stalls when the leading orchestrator replica is killed -9.

Starts a local etcd, three orchestrator replicas (``--store etcd://``) and three
training workers (tests/strategy/elastic_worker.py: a custom loop, one line per
step) given every replica. At step ``--kill_at`` the leader is killed -9. The
stall is the longest gap between two consecutive step lines of a worker,
as this script receives them (its own monotonic clock), after the kill,
next to the longest gap before it; the failover is the kill to the new
leader's election event. Run it several times and compare medians.

    python benchmarks/failover_training.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from harness import REPO, Orchestrator, Process, child_env, exit_on_sigterm, gaps, wait_until

from tensorflow_elastic.observability import events
from tools.etcd_server import EtcdServer

WORKER = os.path.join(REPO, "tests", "strategy", "elastic_worker.py")


def _replica(url: str, ttl: int, events_file: str) -> Orchestrator:
    return Orchestrator("--store", url, "--leader_ttl", str(ttl), "--heartbeat_timeout", "5",
                        "--last_call", "1", "--events_file", events_file)


class _Worker(Process):
    """A worker whose step lines are kept as (arrival on this script's monotonic clock, step)."""

    def __init__(self, endpoints: str, steps: int, step_sleep: float):
        self.steps: list[tuple[float, int]] = []
        super().__init__([sys.executable, WORKER, str(steps), str(step_sleep)],
                         child_env("2", TFE_RDZV_ENDPOINT=endpoints, TFE_RUN_ID="bench",
                                   TFE_MIN_NODES="2", TFE_MAX_NODES="3"))

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith('{"node"'):
                self.steps.append((time.monotonic(), json.loads(line)["step"]))

    def last_step(self) -> int:
        return self.steps[-1][1] if self.steps else 0


def _longest_gap(times: list[float]) -> float:
    return max(gaps(times), default=0.0)


def one_run(args: argparse.Namespace, tmp: str) -> dict:
    events_file = os.path.join(tmp, "events.jsonl")
    etcd = EtcdServer(os.path.join(tmp, "etcd")).start()
    replicas, workers = [], []
    try:
        replicas.append(_replica(etcd.url, args.leader_ttl, events_file))
        time.sleep(1.0)  # the first one leads
        replicas += [_replica(etcd.url, args.leader_ttl, events_file) for _ in range(2)]
        endpoints = ",".join(r.endpoint for r in replicas)
        workers = [_Worker(endpoints, args.steps, args.step_sleep) for _ in range(3)]

        def check() -> None:
            if any(w.proc.poll() is not None for w in workers):
                raise RuntimeError("the workers did not reach --kill_at")

        wait_until(lambda: min(w.last_step() for w in workers) >= args.kill_at, "--kill_at",
                   interval=0.01, check=check)
        killed_at = time.monotonic()
        killed_wall = time.time()
        replicas[0].proc.kill()
        for w in workers:
            if w.proc.wait(timeout=300) != 0:
                raise RuntimeError("a worker failed")
        elected = [e for e in events.read_events(events_file, event=events.ORCHESTRATOR_FAILOVER)]
        if not elected:
            raise RuntimeError("no failover was recorded")
        before = [_longest_gap([t for t, _ in w.steps if t < killed_at]) for w in workers]
        after = [_longest_gap([t for t, _ in w.steps if t >= killed_at - 1.0]) for w in workers]
        return {"failover_s": round(elected[0]["time"] - killed_wall, 3),
                "longest_stall_after_kill_s": round(max(after), 3),
                "longest_stall_before_kill_s": round(max(before), 3),
                "steps": [w.steps[-1][1] for w in workers]}
    finally:
        for process in (*workers, *replicas):
            process.stop()
        etcd.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--step_sleep", type=float, default=0.02)
    parser.add_argument("--kill_at", type=int, default=40)
    parser.add_argument("--leader_ttl", type=int, default=1)
    args = parser.parse_args(argv)
    exit_on_sigterm()
    results = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            results.append(one_run(args, tmp))
        print(json.dumps(results[-1]), flush=True)
    summary = {key: {"median": statistics.median(r[key] for r in results),
                     "max": max(r[key] for r in results)}
               for key in ("failover_s", "longest_stall_after_kill_s",
                           "longest_stall_before_kill_s")}
    print(json.dumps({"runs": results, "summary": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
