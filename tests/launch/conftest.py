"""Launcher processes for the tests: started with the module, read line by line, ended by pid.

A launcher starts its workers in their own sessions, so at teardown every
worker pid the launcher announced is killed as well as the launcher itself.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from typing import Callable, Iterator

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
ELASTIC_WORKER = os.path.join(REPO_ROOT, "tests", "strategy", "elastic_worker.py")
MWMS_WORKER = os.path.join(HERE, "mwms_worker.py")
PLAIN_WORKER = os.path.join(HERE, "plain_worker.py")
WAIT_S = 120.0
_WORKER_STARTED = re.compile(r"\[agent\] worker (\d+) started: pid (\d+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, e.get("PYTHONPATH")) if p)
    e["TF_CPP_MIN_LOG_LEVEL"] = "2"
    for name in ("TFE_RDZV_TOKEN", "TFE_EVENTS_FILE", "TF_CONFIG"):
        e.pop(name, None)
    return e


class Proc:
    """A launcher-like process (``python -m MODULE ARGS``) whose output lines are kept, with the
    time.monotonic() each arrived at; ``wrap`` wraps the command (e.g. to run it on another
    network stack)."""

    def __init__(self, module: str, args: list[str], cwd: str,
                 wrap: Callable[[list[str]], list[str]] = lambda argv: argv):
        self.proc = subprocess.Popen(wrap([sys.executable, "-m", module, *args]), env=env(),
                                     cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines: list[str] = []
        self.times: list[float] = []
        self._eof = False
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self.times.append(time.monotonic())
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    @property
    def output(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = WAIT_S, count: int = 1) -> list[re.Match]:
        """Waits until ``count`` lines match ``pattern``; fails with the output tail otherwise."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                matches = [m for m in map(regex.search, self.lines) if m]
                if len(matches) >= count:
                    return matches
                if self._eof:
                    raise AssertionError(f"exited ({self.proc.returncode}) before {count} "
                                         f"line(s) matching {pattern!r}:\n{self.tail()}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"no {count} line(s) matching {pattern!r} in "
                                         f"{timeout} s:\n{self.tail()}")
                self._cond.wait(min(remaining, 0.5))

    def wait(self, timeout: float = WAIT_S) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout} s:\n{self.tail()}") from None
        with self._cond:
            self._cond.wait_for(lambda: self._eof, timeout=10)
        return code

    def worker_pids(self) -> dict[int, list[int]]:
        """Local rank -> every pid the launcher started for it, oldest first."""
        pids: dict[int, list[int]] = {}
        for line in list(self.lines):
            m = _WORKER_STARTED.search(line)
            if m:
                pids.setdefault(int(m.group(1)), []).append(int(m.group(2)))
        return pids

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.lines[-lines:])

    def kill_all(self) -> None:
        for pids in self.worker_pids().values():
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        self.signal(signal.SIGKILL)
        self.proc.wait(timeout=30)


@pytest.fixture
def scripts() -> types.SimpleNamespace:
    """Paths of the worker scripts: plain (no TensorFlow), mwms (TF_CONFIG), elastic (tfe.init)."""
    return types.SimpleNamespace(plain=PLAIN_WORKER, mwms=MWMS_WORKER, elastic=ELASTIC_WORKER)


@pytest.fixture
def port() -> Callable[[], int]:
    """port() is a port that is free on 127.0.0.1 right now."""
    return free_port


@pytest.fixture
def start(tmp_path) -> Iterator[Callable[..., Proc]]:
    """start(*args, module=launch, wrap=...) runs a launcher (or tensorflowrun) in tmp_path; all
    are killed, with their workers, at teardown."""
    started: list[Proc] = []

    def run(*args: str, module: str = "tensorflow_elastic.distributed.launch",
            wrap: Callable[[list[str]], list[str]] = lambda argv: argv) -> Proc:
        proc = Proc(module, list(args), str(tmp_path), wrap)
        started.append(proc)
        return proc

    yield run
    for proc in started:
        proc.kill_all()
