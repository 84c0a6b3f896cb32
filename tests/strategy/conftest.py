"""Real multi-process elastic clusters: an orchestrator process and TensorFlow worker processes."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Iterator

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
STEP_TIMEOUT_S = 120.0


class Worker:
    """One worker process; its JSON lines (one per committed step) are collected as they come."""

    def __init__(self, endpoint: str, run_id: str, min_nodes: int, max_nodes: int,
                 script: str, args: list[str], events_file: str, env: dict[str, str]):
        env = dict(env, TFE_RDZV_ENDPOINT=endpoint, TFE_RUN_ID=run_id,
                   TFE_MIN_NODES=str(min_nodes), TFE_MAX_NODES=str(max_nodes),
                   TFE_EVENTS_FILE=events_file, TF_CPP_MIN_LOG_LEVEL="2")
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, script), *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=env)
        self.records: list[dict] = []
        self.output: list[str] = []
        self._new = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.output.append(line)
            if line.startswith("{"):
                record = json.loads(line)
                self.records.append(record)
                self._new.put(record)

    @property
    def node_id(self) -> int | None:
        return self.records[0]["node"] if self.records else None

    @property
    def steps(self) -> list[dict]:
        return [r for r in self.records if "step" in r]

    @property
    def result(self) -> dict | None:
        done = [r for r in self.records if r.get("done")]
        return done[0] if done else None

    def wait_for_step(self, step: int, timeout: float = STEP_TIMEOUT_S) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            reached = [r for r in self.steps if r["step"] >= step]
            if reached:
                return reached[0]
            if self.proc.poll() is not None and self._new.empty():
                raise AssertionError(f"worker exited with {self.proc.returncode} before step "
                                     f"{step}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no step {step} in {timeout} s:\n{self.log_tail()}")
            try:
                self._new.get(timeout=0.2)
            except queue.Empty:
                pass

    def wait(self, timeout: float = STEP_TIMEOUT_S) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker still running after {timeout} s:\n{self.log_tail()}")

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def log_tail(self, lines: int = 40) -> str:
        return "".join(self.output[-lines:])


@pytest.fixture
def start_workers(tmp_path, subprocess_env) -> Iterator[Callable[..., list[Worker]]]:
    """Starts worker processes of one run; kills those still running at teardown."""
    started: list[Worker] = []

    def start(endpoint: str, count: int, min_nodes: int, max_nodes: int, steps: int = 60,
              step_sleep: float = 0.05, run_id: str = "job", script: str = "elastic_worker.py",
              args: list[str] | None = None, env: dict[str, str] | None = None) -> list[Worker]:
        """`count` workers of `script` (default: the custom loop with `steps`, `step_sleep`)."""
        args = [str(steps), str(step_sleep)] if args is None else args
        workers = [Worker(endpoint, run_id, min_nodes, max_nodes, script, args,
                          str(tmp_path / "events.jsonl"), dict(subprocess_env, **(env or {})))
                   for _ in range(count)]
        started.extend(workers)
        return workers

    yield start
    for worker in started:
        worker.signal(signal.SIGKILL)
        worker.proc.wait(timeout=30)
