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
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from tensorflow_elastic.observability import events  # noqa: E402
from tools.etcd_server import EtcdServer  # noqa: E402

WORKER = os.path.join(REPO_ROOT, "tests", "strategy", "elastic_worker.py")


def _env() -> dict[str, str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
    return env


def _replica(url: str, ttl: int, events_file: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorflow_elastic.rendezvous", "--port", "0", "--store", url,
         "--leader_ttl", str(ttl), "--heartbeat_timeout", "5", "--last_call", "1",
         "--events_file", events_file], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True, env=_env())
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        raise RuntimeError("an orchestrator replica did not start")
    return proc, line.split()[-1]


class _Worker:
    def __init__(self, endpoints: str, steps: int, step_sleep: float):
        self.proc = subprocess.Popen(
            [sys.executable, WORKER, str(steps), str(step_sleep)], stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True,
            env=dict(_env(), TFE_RDZV_ENDPOINT=endpoints, TFE_RUN_ID="bench",
                     TFE_MIN_NODES="2", TFE_MAX_NODES="3"))
        self.steps: list[tuple[float, int]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith('{"node"'):
                self.steps.append((time.monotonic(), json.loads(line)["step"]))


def _longest_gap(times: list[float]) -> float:
    return max((b - a for a, b in zip(times, times[1:])), default=0.0)


def one_run(args: argparse.Namespace, tmp: str) -> dict:
    events_file = os.path.join(tmp, "events.jsonl")
    etcd = EtcdServer(os.path.join(tmp, "etcd")).start()
    replicas, workers = [], []
    try:
        replicas.append(_replica(etcd.url, args.leader_ttl, events_file))
        time.sleep(1.0)  # the first one leads
        replicas += [_replica(etcd.url, args.leader_ttl, events_file) for _ in range(2)]
        endpoints = ",".join(e for _, e in replicas)
        workers = [_Worker(endpoints, args.steps, args.step_sleep) for _ in range(3)]
        deadline = time.monotonic() + 300
        while min((w.steps[-1][1] if w.steps else 0) for w in workers) < args.kill_at:
            if time.monotonic() > deadline or any(w.proc.poll() is not None for w in workers):
                raise RuntimeError("the workers did not reach --kill_at")
            time.sleep(0.01)
        killed_at = time.monotonic()
        killed_wall = time.time()
        replicas[0][0].kill()
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
        for w in workers:
            if w.proc.poll() is None:
                w.proc.kill()
            w.proc.wait(timeout=30)
        for proc, _ in replicas:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
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
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
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
