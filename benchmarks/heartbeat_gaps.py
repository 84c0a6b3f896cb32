"""Does a healthy but slow member ever look dead? Heartbeat gaps under load.

Starts an orchestrator (--heartbeat_timeout, default 1.5 s) and --workers elastic workers
(benchmarks/recovery_worker.py, a commit every step) that heartbeat every
$TFE_HEARTBEAT_INTERVAL (default 0.25 s), with optional load:

* --burners N: N processes spinning on the CPU (2 = both cores of a 2-core machine busy
  on top of the workers);
* --pause_every K --pause_s S --pause_kind python|gil: every K steps each worker's main
  thread is busy in Python for S seconds before its commit (gil: one C call that holds
  the GIL throughout, so the heartbeat thread cannot run).

From the workers' start (their TensorFlow start-up and first trace included) to their end,
this script polls the orchestrator's status every 0.1 s and keeps every member's silence
(``silent_s``: time since the member was last heard).
No fault is injected, so every removal is a false one. The last line is JSON:
{"heartbeat_timeout_s", "burners", "pause", "silent_p50_s", "silent_p99_s", "silent_max_s",
 "false_removals", "steps_per_s"}.

    python benchmarks/heartbeat_gaps.py --burners 2
    python benchmarks/heartbeat_gaps.py --burners 2 --pause_every 20 --pause_s 1 --pause_kind gil
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time

from harness import WAIT_S, percentile
from recovery import elastic_workers, start_orchestrator

from tensorflow_elastic.observability.events import FAILURE_DETECTED, read_events
from tensorflow_elastic.rendezvous import Client
from tensorflow_elastic.rendezvous.errors import RendezvousError

POLL_S = 0.1


def _burn() -> None:
    while True:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--heartbeat_timeout", type=float, default=1.5)
    parser.add_argument("--burners", type=int, default=2)
    parser.add_argument("--pause_every", type=int, default=0)
    parser.add_argument("--pause_s", type=float, default=1.0)
    parser.add_argument("--pause_kind", choices=["python", "gil"], default="python")
    args = parser.parse_args(argv)

    burners = [mp.Process(target=_burn, daemon=True) for _ in range(args.burners)]
    for b in burners:
        b.start()
    orchestrator = start_orchestrator(heartbeat_timeout=args.heartbeat_timeout)
    tmp = tempfile.mkdtemp(prefix="tfe-gaps-")
    events_file = os.path.join(tmp, "events.jsonl")
    flags = ("--pause_every", str(args.pause_every), "--pause_s", str(args.pause_s),
             "--pause_kind", args.pause_kind)
    workers = elastic_workers(orchestrator, args.workers, "gaps", args.steps, args.workers,
                              args.workers, events_file, flags)
    silences: list[float] = []
    client = Client(orchestrator.endpoint, "gaps")
    deadline = time.monotonic() + WAIT_S
    try:
        while any(w.proc.poll() is None for w in workers):
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- pid {w.proc.pid}, last step {w.last_step()}:\n"
                                  f"{w.stderr_tail(40)}" for w in workers)
                raise TimeoutError(f"the workers still run after {WAIT_S:g} s (events: "
                                   f"{events_file})\n{tails}")
            try:
                status = client.status()[0]
            except RendezvousError:
                time.sleep(POLL_S)  # the run does not exist yet, or it completed and expired
                continue
            silences += [n.silent_s for n in status.nodes if n.role == "member"]
            time.sleep(POLL_S)
        steps = sum(w.last_step() for w in workers)
        elapsed = max(r["t"] for w in workers for r in w.records) - min(
            w.records[0]["t"] for w in workers)
        for w in workers:
            w.wait_for(lambda w=w: w.proc.poll() is not None, "the workers to finish")
    finally:
        client.close()
        for w in workers:
            w.stop()
        orchestrator.stop()
        for b in burners:
            b.kill()
    removals = [e for e in read_events(events_file, FAILURE_DETECTED)
                if e.get("source") == "orchestrator"]
    for e in removals:
        print(f"false removal: {e['failed']} ({e['cause']})", flush=True)
    pause = (f"{args.pause_kind} {args.pause_s:g} s every {args.pause_every} steps"
             if args.pause_every else "none")
    print(json.dumps({
        "heartbeat_timeout_s": args.heartbeat_timeout, "burners": args.burners, "pause": pause,
        "silent_p50_s": round(statistics.median(silences), 3),
        "silent_p99_s": round(percentile(silences, 99), 3),
        "silent_max_s": round(max(silences), 3), "false_removals": len(removals),
        "steps_per_s": round(steps / args.workers / elapsed, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
