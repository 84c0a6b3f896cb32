"""A member dies while the others wait for it outside any collective, in the first state sync.

No collective runs, so none fails and nobody reports the loss: the
orchestrator finds it. Its watch stream breaks when the process dies, and
after --watch_loss_grace (2 s) without a heartbeat it is removed; the
others' sync ends with GenerationChangedError and `tfe.run` re-forms without
it. Before, the survivors waited for the heartbeat timeout (10 s by default)
and then crashed.

For each repeat: a straggler worker joins first and pauses before training;
--workers - 1 others join and block in the sync; the straggler is SIGKILLed a
second later. Measured: kill -> the survivors' first step (and their first
generation_start event). The orchestrator runs with its default heartbeat
timeout (10 s). Last line: {"kill_to_first_step_s_median", "kill_to_generation_s_median"}.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time

from harness import Process
from recovery import elastic_workers, start_orchestrator

from tensorflow_elastic.observability.events import GENERATION_START, read_events

STEPS = 40


def one_loss(workers: int, tmp: str, repeat: int) -> tuple[float, float]:
    orchestrator = start_orchestrator(heartbeat_timeout=10.0)
    events_file = os.path.join(tmp, f"loss-{repeat}.jsonl")
    run_id = f"loss-{repeat}"
    started: list[Process] = []
    try:
        straggler = elastic_workers(orchestrator, 1, run_id, STEPS, 2, workers, events_file,
                                    ("--pause_before_training", "600"))[0]
        started.append(straggler)
        # It joins first, so it is surely in the first generation.
        time.sleep(2.0)
        others = elastic_workers(orchestrator, workers - 1, run_id, STEPS, 2, workers,
                                 events_file)
        started += others
        straggler.wait_for(lambda: straggler.records, "the straggler to pause")
        time.sleep(1.0)
        killed_at = time.time()
        straggler.stop(signal.SIGKILL)
        for p in others:
            p.wait_for(lambda p=p: p.records, "a survivor's first step")
        first_step = min(p.records[0]["t"] for p in others) - killed_at
        starts = [e["time"] for e in read_events(events_file, GENERATION_START)
                  if e["time"] > killed_at]
        for p in others:
            p.wait_for(lambda p=p: p.proc.poll() is not None, "the survivors to finish")
        return first_step, min(starts) - killed_at
    finally:
        for p in started:
            p.stop()
        orchestrator.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=3, help="workers, the straggler included "
                        "(default 3)")
    parser.add_argument("--repeats", type=int, default=5, help="runs (default 5)")
    args = parser.parse_args(argv)
    if args.workers < 3:
        parser.error("--workers must be at least 3 (two must survive: min_nodes is 2)")
    results = []
    with tempfile.TemporaryDirectory(prefix="tfe-loss-") as tmp:
        for repeat in range(args.repeats):
            first_step, generation = one_loss(args.workers, tmp, repeat)
            results.append((first_step, generation))
            print(f"[{repeat + 1}/{args.repeats}] kill -> generation_start {generation:.3f} s, "
                  f"kill -> first step {first_step:.3f} s", flush=True)
    print(json.dumps({
        "kill_to_first_step_s_median": round(statistics.median(r[0] for r in results), 3),
        "kill_to_generation_s_median": round(statistics.median(r[1] for r in results), 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
