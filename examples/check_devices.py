"""A setup check for workers of several devices: kill a worker, let one join, compare weights.

    python examples/check_devices.py [--workers 2] [--cpu_devices 2]

It starts a small elastic job here (`tfelastic-run --standalone`, --workers
workers): each worker drives its share of the machine's GPUs (the launcher's
`--gpus split`: one GPU each, or several when there are more GPUs than
workers; fewer GPUs than workers is refused), or --cpu_devices logical CPU
devices when it sees no GPU; one replica a device. It SIGKILLs the chief
mid-run, the launcher starts a new worker, which joins the running job; then
every worker trains to a common step (examples/check_devices_worker.py).
PASS when every local copy of every variable is the same on every worker,
every example was trained on exactly once, and the weights equal those of one
plain process trained on the same global batches; FAIL otherwise, saying
what differed. Exit code 0 on PASS.
"""

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from tensorflow_elastic.launch.gpus import visible_gpus

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_devices_worker.py")
WAIT_S = 300.0
REPLAY_RTOL = 1e-6  # float64 throughout; the job sums each step's terms in another order


class Job:
    """The launcher and the records its workers print (one JSON object a line)."""

    def __init__(self, args: argparse.Namespace, control: str):
        self.launcher = subprocess.Popen(
            [sys.executable, "-m", "tensorflow_elastic.distributed.launch", "--standalone",
             f"--nproc_per_node={args.workers}", f"--nworkers=1:{args.workers}",
             "--max_restarts=1", f"--log_dir={os.path.join(control, 'logs')}", WORKER,
             f"--control={control}", f"--cpu_devices={args.cpu_devices}",
             f"--global_batch={args.global_batch}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
        self.records: list[dict] = []
        self.lines: collections.deque = collections.deque(maxlen=40)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.launcher.stdout:
            self.lines.append(line)
            try:
                self.records.append(json.loads(line[line.index("{"):]))
            except ValueError:  # the launcher's own lines: membership changes, restarts
                print(line, end="", flush=True)

    def wait_for(self, what: str, predicate):
        """predicate()'s first true value; raises when the launcher ended or after WAIT_S."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            found = predicate()
            if found:
                return found
            if self.launcher.poll() is not None and not self.reader.is_alive():
                raise RuntimeError(f"the job ended (exit {self.launcher.returncode}) before "
                                   f"{what}:\n{self.tail()}")
            time.sleep(0.05)
        raise TimeoutError(f"no {what} in {WAIT_S:g} s:\n{self.tail()}")

    def tail(self) -> str:
        return "".join(self.lines)

    def steps(self) -> list[dict]:
        return [r for r in self.records if "step" in r and "done" not in r]

    def stop(self) -> None:
        if self.launcher.poll() is None:
            self.launcher.send_signal(signal.SIGTERM)
            try:
                self.launcher.wait(30)
            except subprocess.TimeoutExpired:
                self.launcher.kill()


def run_job(args: argparse.Namespace, control: str) -> tuple[list[dict], list[dict], str]:
    """The job with its kill and its newcomer: (the workers' devices lines, their done lines,
    what happened)."""
    job = Job(args, control)
    try:
        def every_worker_training():
            nodes = {r["node"] for r in job.steps() if r["step"] >= 5}
            return nodes if len(nodes) == args.workers else None

        first = job.wait_for("training with every worker", every_worker_training)
        replicas = max(r["replicas"] for r in job.steps())
        chief = min(first)
        victim = max((r for r in job.steps() if r["node"] == chief), key=lambda r: r["step"])
        os.kill(victim["pid"], signal.SIGKILL)
        story = f"killed the chief (node {chief}) at step {victim['step']}; "
        joined = job.wait_for("a newcomer training with the others", lambda: next(
            (r for r in job.steps() if r["node"] not in first and r["replicas"] == replicas),
            None))
        story += f"node {joined['node']} joined at step {joined['step']}"
        target = joined["step"] + 20
        with open(os.path.join(control, "stop.tmp"), "w") as f:
            f.write(str(target))
        os.rename(os.path.join(control, "stop.tmp"), os.path.join(control, "stop"))
        members = (first - {chief}) | {joined["node"]}

        def every_member_done():
            done = [r for r in job.records if r.get("done")]
            return done if {r["node"] for r in done} >= members else None

        done = job.wait_for("every worker's end", every_member_done)
        job.launcher.wait(WAIT_S)
    finally:
        job.stop()
    devices = [r for r in job.records if "devices" in r]
    return devices, done, story + f"; trained to step {target} ({replicas} replicas)"


def replay(args: argparse.Namespace, steps: int) -> list[float]:
    out = subprocess.run([sys.executable, WORKER, "--replay", str(steps),
                          "--global_batch", str(args.global_batch)], capture_output=True,
                         text=True, timeout=WAIT_S, check=True,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")).stdout
    return json.loads(out.strip().splitlines()[-1])["weights"]


def failures(done: list[dict], expected: list[float]) -> list[str]:
    """What differs from PASS: copies that disagree, examples not trained on once, weights
    other than the replay's."""
    found = []
    reference = done[0]["digests"]
    for record in done:
        for name, copies, first in zip(("weights", "counts"), record["digests"], reference):
            if set(copies) != {first[0]}:
                found.append(f"node {record['node']}: its replicas' copies of {name} differ "
                             "from each other or from another worker's")
        if not record["once"]:
            found.append(f"node {record['node']}: an example was lost or trained on twice")
        if not np.allclose(record["weights"], expected, rtol=REPLAY_RTOL, atol=1e-12):
            found.append(f"node {record['node']}: weights {record['weights']} differ from the "
                         f"single-process replay's {expected}")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="workers (default 2)")
    parser.add_argument("--cpu_devices", type=int, default=2,
                        help="logical CPU devices a worker drives when it sees no GPU "
                        "(default 2)")
    parser.add_argument("--global_batch", type=int, default=24,
                        help="examples a step trains on, cut among every replica of the job "
                        "(default 24)")
    args = parser.parse_args()
    if args.workers < 2:
        parser.error("--workers must be at least 2 (one is killed)")
    gpus = visible_gpus()
    if 0 < len(gpus) < args.workers:
        parser.error(f"{len(gpus)} GPU(s) for {args.workers} workers: NCCL takes at most one "
                     "worker a GPU (check on logical CPUs with CUDA_VISIBLE_DEVICES= before "
                     "the command)")
    with tempfile.TemporaryDirectory(prefix="tfelastic-check-") as control:
        devices, done, story = run_job(args, control)
    steps = done[0]["step"]
    print("==> ran on: " + "; ".join(sorted(
        {f"node {r['node']}: {len(r['devices'])} device(s) "
         f"{', '.join(d.rsplit('device:', 1)[-1] for d in r['devices'])}"
         + (f" (GPUs {', '.join(r['gpus'])})" if r["gpus"] else " (no GPU: logical CPUs)")
         for r in devices})), flush=True)
    print(f"==> {story}", flush=True)
    problems = failures(done, replay(args, steps))
    if {r["step"] for r in done} != {steps}:
        problems.append(f"the workers ended at different steps: {[r['step'] for r in done]}")
    if problems:
        print("FAIL:\n  " + "\n  ".join(problems), flush=True)
        return 1
    print(f"PASS: {len(done)} workers at step {steps}: every local copy of every variable "
          "equal on every worker, every example trained on exactly once, weights equal to a "
          "single-process replay of the same global batches", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
