"""Suite-wide setup and the fixtures every multi-process test shares.

Every process a test starts is ended by its pid at teardown; every wait is bounded.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Iterator

import pytest
from _pytest.nodeid import coerce_node_id

import tensorflow_elastic
from tools.etcd_server import EtcdServer
from tools.netns import Hosts, NetnsUnavailable

# Processes the tests start (orchestrators, launchers, workers) must import the
# same tensorflow_elastic as the test itself: the checkout under pytest, the
# runfiles tree under Bazel.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(tensorflow_elastic.__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [REPO_ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
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
def tls_files(tmp_path) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 and its key (PEM paths)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return str(cert), str(key)


def started_etcd(directory) -> Iterator[EtcdServer]:
    """A real etcd (Debian's etcd-server, installed by install.sh) on free ports of 127.0.0.1,
    its data in ``directory``; the test is skipped where etcd is not installed."""
    try:
        server = EtcdServer(str(directory / "etcd")).start()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    yield server
    server.stop()


@pytest.fixture
def etcd_server(tmp_path) -> Iterator[EtcdServer]:
    """An etcd of the test's own."""
    yield from started_etcd(tmp_path)


def netns_hosts(n: int) -> Hosts:
    """`n` hosts on network stacks of their own (tools/netns.py), or the test is skipped where
    network namespaces are not permitted."""
    try:
        return Hosts(n)
    except NetnsUnavailable as e:
        pytest.skip(str(e))


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


# ------------------------------------------------------- elastic TensorFlow workers

STEP_TIMEOUT_S = 120.0


class Worker:
    """One worker process; its JSON lines (one per committed step) are collected as they come."""

    def __init__(self, endpoint: str, run_id: str, min_nodes: int, max_nodes: int,
                 script: str, args: list[str], events_file: str, env: dict[str, str]):
        env = dict(env, TFE_RDZV_ENDPOINT=endpoint, TFE_RUN_ID=run_id,
                   TFE_MIN_NODES=str(min_nodes), TFE_MAX_NODES=str(max_nodes),
                   TFE_EVENTS_FILE=events_file, TF_CPP_MIN_LOG_LEVEL="2")
        self.proc = subprocess.Popen([sys.executable, os.path.join(TESTS_DIR, script), *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env)
        self.records: list[dict] = []
        self.output: list[str] = []
        self._new = queue.Queue()
        # Records come on stdout alone: TensorFlow's native log lines on stderr could land in
        # the middle of one.
        self._readers = [threading.Thread(target=self._read, args=(stream, stream is self.proc.stdout),
                                          daemon=True)
                         for stream in (self.proc.stdout, self.proc.stderr)]
        for reader in self._readers:
            reader.start()

    def _read(self, stream, records: bool) -> None:
        for line in stream:
            self.output.append(line)
            if records and line.startswith("{"):
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
        """The exit code, once every line the worker wrote has been read."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker still running after {timeout} s:\n{self.log_tail()}")
        for reader in self._readers:
            reader.join(timeout=30)
        return code

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def log_tail(self, lines: int = 40) -> str:
        return "".join(self.output[-lines:])

    def diagnostics(self, records: int = 3) -> str:
        """Everything it printed but its step records, then its last few records."""
        other = [line for line in self.output if not line.startswith("{")]
        last = [line for line in self.output if line.startswith("{")][-records:]
        return f"exit code {self.proc.poll()}\n" + "".join(other + last)


@pytest.fixture
def start_workers(tmp_path, subprocess_env) -> Iterator[Callable[..., list[Worker]]]:
    """Starts worker processes of one run; kills those still running at teardown."""
    started: list[Worker] = []

    def start(endpoint: str, count: int, min_nodes: int, max_nodes: int, steps: int = 60,
              step_sleep: float = 0.05, run_id: str = "job",
              script: str = "strategy/elastic_worker.py", args: list[str] | None = None,
              env: dict[str, str] | None = None) -> list[Worker]:
        """`count` workers of `script` (a path under tests/; default: the custom loop with
        `steps` and `step_sleep`)."""
        args = [str(steps), str(step_sleep)] if args is None else args
        workers = [Worker(endpoint, run_id, min_nodes, max_nodes, script, args,
                          str(tmp_path / "events.jsonl"), dict(subprocess_env, **(env or {})))
                   for _ in range(count)]
        started.extend(workers)
        return workers

    start.workers = started
    yield start
    for worker in started:
        worker.signal(signal.SIGKILL)
        worker.proc.wait(timeout=30)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The multi-process tests take the machine's cores (and the network-namespace subnet): under
    pyproject's two test processes (`--dist loadgroup`) they run one at a time, all in one of
    them, with the tests marked serial. The light ones (about one core, no tight timing) run one
    at a time in a group of their own, which goes to the other process (xdist hands the largest
    groups out first, one to each). xdist groups the tests whose id ends in @GROUP; it writes that
    suffix where pytest 9 no longer reads it, so the suffix is put on the id here."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        group = _group(item)
        if group is not None:
            item._id = coerce_node_id(f"{item.nodeid}@{group}")  # noqa: SLF001


def _group(item: pytest.Item) -> str | None:
    if item.get_closest_marker("serial"):
        return "multiprocess"
    if item.get_closest_marker("multiprocess"):
        return "light" if item.get_closest_marker("light") else "multiprocess"
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed multi-process test shows what every worker printed, not only the one it named."""
    outcome = yield
    report = outcome.get_result()
    start = getattr(item, "funcargs", {}).get("start_workers")
    if report.when == "call" and report.failed and start is not None:
        for worker in start.workers:
            report.sections.append(
                (f"worker pid {worker.proc.pid}, node {worker.node_id}", worker.diagnostics()))
        events_file = item.funcargs["tmp_path"] / "events.jsonl"
        if events_file.exists():
            report.sections.append(("last events", "".join(events_file.read_text().splitlines(
                keepends=True)[-40:])))
