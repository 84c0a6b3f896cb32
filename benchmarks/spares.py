"""A worker killed under tfelastic-run: its replacement's time to its first contributing step,
with a warm spare (--spares 1) and without (the replacement starts after the death), side by
side; with --ways ... forked also without a spare but with --fork_server (the replacement is
forked from the launcher's fork server after the death).

Each round runs the launcher once each way (the order rotates from round to round), with
--standalone --nworkers 1:2 --nproc_per_node 2 and benchmarks/recovery_worker.py (--model
picks the model of benchmarks/models.py). Once both workers train (and, with a spare, the
spare says it is ready) one worker gets SIGKILL; measured:

* from the kill to the replacement's first contributing step (the end of its first step in
  the job: its gradients are part of that step's all-reduce);
* from the replacement's process start (the agent's line that started it) to that step;
* the survivor's longest step gap from the kill on.

The launcher then gets SIGTERM (a graceful leave). Prints a line per run, then per way the
medians with their ranges, and as its last line the JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from harness import REPO, WAIT_S, child_env, end, exit_on_sigterm, gaps, wait_until

WORKER = os.path.join(REPO, "benchmarks", "recovery_worker.py")
GLOBAL_BATCH = {"tiny": 48, "wide": 48, "transformer": 6, "resnet50": 6}
_STARTED = re.compile(r"^\[agent\] (worker|spare) (\d+) started: pid (\d+)")
_RECORD = re.compile(r"^\[node (\d+)\] (\{.*\})$")
_SPARE_READY = re.compile(r"^\[spare \d+\] node (\d+) is a spare, ready")
_SPARE_TAKEN = re.compile(r"^\[agent\] restart \d+ of \d+: spare \d+ \(pid (\d+)\)")
WAYS = {"restart": ("--spares=0",), "spare": ("--spares=1",),
        "forked": ("--spares=0", "--fork_server")}  # the launcher's flags of each way


class Launcher:
    """A tfelastic-run whose output lines are kept with the time each arrived."""

    def __init__(self, flags: tuple[str, ...], model: str, tmp: str):
        argv = [sys.executable, "-m", "tensorflow_elastic.distributed.launch", "--standalone",
                "--nworkers=1:2", "--nproc_per_node=2", *flags,
                "--max_restarts=2", "--monitor_interval=0.5", "--progress_interval=0",
                f"--log_dir={tmp}", WORKER, "--mode", "elastic", "--model", model,
                "--global_batch", str(GLOBAL_BATCH[model]), "--steps", "1000000"]
        self.proc = subprocess.Popen(argv, env=child_env(), cwd=REPO, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[tuple[float, str]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def matches(self, regex: re.Pattern) -> list[tuple[float, re.Match]]:
        return [(t, m) for t, line in list(self.lines) if (m := regex.search(line))]

    def records(self) -> list[tuple[int, dict]]:
        return [(int(m.group(1)), json.loads(m.group(2))) for _, m in self.matches(_RECORD)]

    def wait(self, predicate, what: str):
        def check() -> None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the launcher exited before {what}:\n"
                                   + "\n".join(line for _, line in self.lines[-30:]))
        return wait_until(predicate, what, WAIT_S, check=check)


def one_run(way: str, model: str, warm_steps: int) -> dict:
    spares = way == "spare"
    with tempfile.TemporaryDirectory(prefix="tfe-spares-") as tmp:
        launcher = Launcher(WAYS[way], model, tmp)
        try:
            launcher.wait(lambda: len({n for n, r in launcher.records()
                                       if r["world"] == 2 and r["step"] >= warm_steps}) == 2,
                          "two workers training")
            if spares:
                launcher.wait(lambda: launcher.matches(_SPARE_READY), "the spare's warm-up")
            members = {n for n, _ in launcher.records()}
            victim = next(int(m.group(3)) for _, m in launcher.matches(_STARTED)
                          if m.group(1) == "worker" and m.group(2) == "1")
            killed = time.time()
            os.kill(victim, signal.SIGKILL)
            newcomer = launcher.wait(
                lambda: next((n for n, r in launcher.records() if n not in members), None),
                "the replacement's first step")
            first_step = min(r["t"] for n, r in launcher.records() if n == newcomer)
            if spares:
                taken = launcher.wait(lambda: launcher.matches(_SPARE_TAKEN), "the spare taken")
                pid = taken[0][1].group(1)
                started = next(t for t, m in launcher.matches(_STARTED) if m.group(3) == pid)
            else:
                started = next(t for t, m in launcher.matches(_STARTED)
                               if m.group(1) == "worker" and t > killed)
            time.sleep(1.0)  # a few steps of the new world
            survivor_gap = max(max(gaps([r["t"] for n, r in launcher.records()
                                         if n == member and r["t"] > killed - 5]), default=0.0)
                               for member in members)
            return {"from_need_s": first_step - killed, "from_start_s": first_step - started,
                    "survivor_gap_s": survivor_gap}
        finally:
            end(launcher.proc, signal.SIGTERM)


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} s ({min(values):.3f}-{max(values):.3f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", choices=sorted(GLOBAL_BATCH))
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds, each one run without a spare and one with (default 3)")
    parser.add_argument("--ways", nargs="+", default=["restart", "spare"], choices=sorted(WAYS),
                        help="how the replacement starts: restart (a fresh process after the "
                        "death), spare (--spares 1), forked (--fork_server; default: restart "
                        "spare)")
    parser.add_argument("--warm_steps", type=int, default=20,
                        help="steps both workers train before the kill (default 20)")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    results: dict[str, list[dict]] = {way: [] for way in args.ways}
    for round_ in range(args.rounds):
        shift = round_ % len(args.ways)
        for way in args.ways[shift:] + args.ways[:shift]:
            result = one_run(way, args.model, args.warm_steps)
            results[way].append(result)
            print(f"round {round_ + 1} {way}: " + ", ".join(f"{k} {v:.3f}"
                                                            for k, v in result.items()),
                  flush=True)
    out = {"model": args.model}
    for way, runs in results.items():
        for key in runs[0]:
            values = [r[key] for r in runs]
            print(f"{way}: {key} {summary(values)}")
            out[f"{way}_{key}_median"] = statistics.median(values)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
