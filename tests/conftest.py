"""Suite-wide setup and the fixtures every multi-process test shares.

Every process a test starts is ended by its pid at teardown; every wait is bounded.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Iterator

import pytest

import tensorflow_elastic

# Processes the tests start (orchestrators, launchers, workers) must import the
# same tensorflow_elastic as the test itself: the checkout under pytest, the
# runfiles tree under Bazel.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(tensorflow_elastic.__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [REPO_ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

START_TIMEOUT_S = 30.0
# Nodes a test joins together arrive within milliseconds; the last call lets a
# generation with min_nodes below their count take them all.
LAST_CALL_S = 1.0


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
    env.pop("TFE_RDZV_TOKEN", None)
    env.pop("TFE_EVENTS_FILE", None)
    return env


class OrchestratorProcess:
    """A ``python -m tensorflow_elastic.rendezvous`` process and what it printed."""

    def __init__(self, args: list[str]):
        self.args = args
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tensorflow_elastic.rendezvous", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(), cwd=REPO_ROOT)
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.port = int(self.wait_for_line("listening on ").rsplit(":", 1)[1])
        self.endpoint = f"127.0.0.1:{self.port}"

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.output.append(line)
            self.lines.put(line.rstrip("\n"))

    def wait_for_line(self, prefix: str, timeout: float = START_TIMEOUT_S) -> str:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.proc.poll() is not None and self.lines.empty():
                raise AssertionError(f"no line {prefix!r} from the orchestrator; it printed: "
                                     f"{''.join(self.output)!r}")
            try:
                line = self.lines.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                continue
            if line.startswith(prefix):
                return line[len(prefix):]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        self.proc.wait(timeout=30)


@pytest.fixture
def subprocess_env() -> dict[str, str]:
    """The environment for child processes: the repository importable, no inherited token."""
    return _env()


@pytest.fixture
def start_orchestrator() -> Iterator[Callable[..., OrchestratorProcess]]:
    """Starts orchestrator processes with the given flags; kills them all afterwards."""
    started: list[OrchestratorProcess] = []

    def start(*flags: str, port: int = 0, heartbeat_timeout: float = 5.0,
              last_call: float = LAST_CALL_S) -> OrchestratorProcess:
        args = ["--host", "127.0.0.1", "--port", str(port),
                "--heartbeat_timeout", str(heartbeat_timeout), "--last_call", str(last_call),
                *flags]
        process = OrchestratorProcess(args)
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()


@pytest.fixture
def orchestrator(start_orchestrator: Callable[..., OrchestratorProcess]) -> OrchestratorProcess:
    return start_orchestrator()


def wait_until(condition: Callable[[], object], timeout: float = 20.0, interval: float = 0.05,
               what: str = "condition") -> object:
    """Polls ``condition`` until it is truthy; fails the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


@pytest.fixture
def wait() -> Callable[..., object]:
    return wait_until
