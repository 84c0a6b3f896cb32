"""The local demo: 3 workers train, one is killed, a new one joins, training finishes.

    python examples/demo.py [--steps 900] [--output timeline.png]

It runs `tfelastic-run --standalone` (an embedded orchestrator) with three
workers of examples/custom_loop.py, SIGKILLs one of them mid-run (the other
two go on in-process), lets the agent restart it as a new node that joins the
running job, and at the end prints a summary (recovery time, lost steps) and
writes the timeline PNG.
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from tensorflow_elastic.observability import plot, timeline

HERE = os.path.dirname(os.path.abspath(__file__))
WAIT_S = 300.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=900)
    parser.add_argument("--kill_at_step", type=int, default=100)
    parser.add_argument("--output", default="timeline.png")
    args = parser.parse_args()
    events_file = os.path.join(tempfile.mkdtemp(prefix="tfelastic-demo-"), "events.jsonl")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tensorflow_elastic.distributed.launch", "--standalone",
         "--nworkers=2:3", "--nproc_per_node=3", "--max_restarts=1", f"--events_file={events_file}",
         "--progress_interval=10", os.path.join(HERE, "custom_loop.py"), f"--steps={args.steps}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    victim: int | None = None
    killed = False
    deadline = time.monotonic() + WAIT_S
    for line in launcher.stdout:
        print(line, end="", flush=True)
        started = re.search(r"\[agent\] worker 2 started: pid (\d+)", line)
        if started and victim is None:
            victim = int(started.group(1))
        if victim is not None and victim > 0 and not killed \
                and re.search(rf"\] step {args.kill_at_step} loss", line):
            print(f"==> demo: killing worker pid {victim} (SIGKILL)", flush=True)
            os.kill(victim, signal.SIGKILL)
            killed = True
        if time.monotonic() > deadline:
            launcher.kill()
            print(f"==> demo: gave up after {WAIT_S:g} s", flush=True)
            break
    code = launcher.wait()
    result = timeline.load(events_file)
    plot.plot_timeline(result, args.output, "demo: 3 workers, one killed and replaced")
    print("==> summary")
    print(timeline.summary(result))
    print(f"==> timeline: {args.output}; events: {events_file}")
    return code


if __name__ == "__main__":
    sys.exit(main())
