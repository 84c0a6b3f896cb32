"""What the benchmarks share: their child processes (started with this checkout on PYTHONPATH,
ended by pid), free ports, bounded waits, the events file read as it grows, and statistics.

Importing it puts the checkout first on sys.path, so that a benchmark run as
`python benchmarks/NAME.py` imports the same tensorflow_elastic as its children.
It imports nothing of TensorFlow nor of the package.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Callable, Iterable, Sequence, TypeVar

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
WAIT_S = 300.0  # the longest wait for a child to reach a point (start-up included)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
TAG_ENV = "TFE_BENCH_TAG"  # marks every process a Job started, so its teardown finds all of them

sys.path.insert(0, REPO)

T = TypeVar("T")


# Statistics.

def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0 to 100), one of `values`: the smallest that more than q % of them
    are at or below (the largest for q = 100)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def nearest_rank_percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0 to 100), one of `values`: the one nearest to q % of the way from
    the smallest to the largest (numpy's method "nearest")."""
    ordered = sorted(values)
    return ordered[int(round(q / 100 * (len(ordered) - 1)))]


def gaps(times: Sequence[float]) -> list[float]:
    """The intervals between consecutive times."""
    return [b - a for a, b in zip(times, times[1:])]


def durations(run: Callable[[], object], calls: int) -> list[float]:
    """The seconds each of `calls` calls of `run` took."""
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - start)
    return seconds


# The events file.

class EventTail:
    """An events file (JSON lines) read as it grows: each poll parses only the lines added
    since the last one and keeps a line still being written for the next."""

    def __init__(self, path: str):
        self.path = path
        self.events: list[dict] = []
        self._offset = 0
        self._partial = b""

    def poll(self, event: str | None = None) -> list[dict]:
        """Every event so far (a missing file has none), or only those named `event`."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            data = b""
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        self.events += [json.loads(line) for line in lines if line.strip()]
        if event is None:
            return self.events
        return [e for e in self.events if e["event"] == event]


# Children: environment, ports, /proc.

def child_env(tf_log_level: str = "3", unset: Iterable[str] = (), **extra: str) -> dict[str, str]:
    """This process's environment for a child: TF_CPP_MIN_LOG_LEVEL and `extra` set, `unset`
    removed, the checkout first on PYTHONPATH (the child imports this tensorflow_elastic), and
    malloc set as the launcher sets it for a worker (stock and elastic children alike, so that
    a comparison measures the elastic code, not the allocator)."""
    from tensorflow_elastic.launch.spec import malloc_tunables
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=tf_log_level, **extra)
    env["GLIBC_TUNABLES"] = malloc_tunables(env.get("GLIBC_TUNABLES"))
    for name in unset:
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    return env


_handed_out: set[int] = set()


def _ephemeral_ports_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A free loopback port below the ephemeral range, never the same one twice.

    A child binds its port seconds later, after importing TensorFlow; a port
    from the ephemeral range may by then be the local end of some connection
    (other workers connect to each other meanwhile), and the cluster never
    forms. Below the range only an explicit bind takes a port.
    """
    start = _ephemeral_ports_start()
    for _ in range(1000):
        port = random.randrange(max(1024, start - 10000), start)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port found below the ephemeral range (from {start})")


def tf_config(addresses: list[str], index: int) -> str:
    """TF_CONFIG of worker `index` of a stock cluster of `addresses`."""
    return json.dumps({"cluster": {"worker": addresses},
                       "task": {"type": "worker", "index": index}})


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of all the process's threads so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def status_mb(pid: int | str, field: str) -> float | None:
    """A memory field of /proc/PID/status ("VmRSS", "VmHWM"; PID may be "self") in MB; None
    where the process has none (it has exited)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return None


def end(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Sends `sig` unless the process has exited and waits for it; a SIGKILL 30 s later."""
    if proc.poll() is None:
        os.kill(proc.pid, sig)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def exit_on_sigterm() -> None:
    """On SIGTERM, unwind through the callers' `finally` blocks, so no child outlives us."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))


def wait_until(predicate: Callable[[], T], what: str, timeout: float = WAIT_S,
               interval: float = 0.02, check: Callable[[], None] | None = None) -> T:
    """predicate()'s first true value, polled every `interval`. `check()` runs between polls
    and raises when waiting is hopeless (a process exited); TimeoutError after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if check is not None:
            check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


# Child processes.

class Process:
    """A child process whose JSON stdout lines are collected in their arrival order (its other
    lines go to `lines`); its stderr goes to a temporary file, or with `quiet=False` to ours."""

    def __init__(self, argv: list[str], env: dict[str, str], quiet: bool = True,
                 fork_server=None):
        self._stderr = tempfile.TemporaryFile(mode="w+") if quiet else None
        if fork_server is None:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._stderr, text=True, env=env, cwd=REPO)
            self._stdin, self._stdout = self.proc.stdin, self.proc.stdout
        else:
            self._fork(fork_server, argv, env)
        self.records: list[dict] = []
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _fork(self, fork_server, argv: list[str], env: dict[str, str]) -> None:
        """Forked from `fork_server` (a launch.preloaded.ForkServer), its stdin and stdout on
        pipes as a subprocess's would be."""
        from tensorflow_elastic.launch.preloaded import python_program
        program = python_program(argv)
        if program is None:
            raise ValueError(f"not a Python command a fork server runs: {argv}")
        in_read, in_write = os.pipe()
        out_read, out_write = os.pipe()
        try:
            self.proc = fork_server.spawn(program, env, REPO, {
                0: in_read, 1: out_write,
                2: self._stderr.fileno() if self._stderr is not None else 2})
        except BaseException:
            os.close(in_write)
            os.close(out_read)
            raise
        finally:
            os.close(in_read)
            os.close(out_write)
        self._stdin = open(in_write, "w")
        self._stdout = open(out_read)

    def _read(self) -> None:
        for line in self._stdout:
            self.lines.put(line)
            if line.startswith("{"):
                self.records.append(json.loads(line))

    def wait_for(self, predicate: Callable[[], object], what: str, timeout: float = WAIT_S,
                 peers: Sequence["Process"] = ()) -> None:
        """Waits until `predicate()`; fails at once if this process or one of `peers` (the
        workers it trains with) exited, and after `timeout` with the end of its stderr."""

        def check() -> None:
            for p in (self, *peers):
                if p.proc.poll() is not None and not predicate():
                    raise RuntimeError(f"pid {p.proc.pid} exited ({p.proc.returncode}) before "
                                       f"{what}; the end of its stderr:\n{p.stderr_tail()}")

        try:
            wait_until(predicate, what, timeout, check=check)
        except TimeoutError as e:
            raise TimeoutError(f"{e}; the end of the stderr of pid {self.proc.pid}:\n"
                               f"{self.stderr_tail()}") from None

    def stderr_tail(self, lines: int = 20) -> str:
        if self._stderr is None:
            return "(on this process's stderr)"
        self._stderr.seek(0)
        return "".join(self._stderr.readlines()[-lines:])

    def send(self, line: str) -> None:
        self._stdin.write(line + "\n")
        self._stdin.flush()

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.proc.pid)

    def peak_rss_mb(self) -> float:
        """The process's peak resident memory so far (VmHWM)."""
        peak = status_mb(self.proc.pid, "VmHWM")
        if peak is None:
            raise RuntimeError(f"no VmHWM in /proc/{self.proc.pid}/status")
        return peak

    def last_step(self) -> int:
        return self.records[-1]["step"] if self.records else 0

    def stop(self, sig: int = signal.SIGKILL) -> None:
        end(self.proc, sig)


class Orchestrator(Process):
    """`python -m tensorflow_elastic.rendezvous` on 127.0.0.1, a free port and `flags`, in `env`
    (default: child_env()); `endpoint` is the address it printed once listening."""

    def __init__(self, *flags: str, env: dict[str, str] | None = None, quiet: bool = True,
                 timeout: float = 60.0):
        super().__init__([sys.executable, "-m", "tensorflow_elastic.rendezvous", "--host",
                          "127.0.0.1", "--port", "0", *flags], env or child_env(), quiet=quiet)
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    raise RuntimeError(f"the orchestrator exited ({self.proc.returncode}) "
                                       f"before listening:\n{self.stderr_tail()}") from None
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(f"the orchestrator did not listen within {timeout:g} s")
                continue
            if line.startswith("listening on "):
                self.endpoint = line.split()[-1]
                return


class LauncherProcess(Process):
    """tfelastic-run: the workers' JSON lines arrive prefixed with "[node N] "."""

    def _read(self) -> None:
        for line in self._stdout:
            _, _, rest = line.partition("] ")
            if line.startswith("[") and rest.startswith("{"):
                self.records.append(json.loads(rest))


def tagged_pids(tag: str) -> list[int]:
    """Processes whose environment carries `tag` in TAG_ENV: only ones a Job started."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in (0, 1, os.getpid()):
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if f"{TAG_ENV}={tag}".encode() in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            pass
    return found


class Job:
    """A training job whose processes carry its tag (`env`), so that signals reach only them
    and `close()` ends every one, however deep in the process tree."""

    def __init__(self):
        self.tag = uuid.uuid4().hex
        self.env = child_env(**{TAG_ENV: self.tag})

    def records(self) -> list[dict]:
        """The step lines of all its workers so far."""
        raise NotImplementedError

    def send_signal(self, pid: int, sig: int) -> None:
        """`sig` to one of this job's processes (a positive pid carrying the job's tag)."""
        if pid <= 1 or pid not in tagged_pids(self.tag):
            raise RuntimeError(f"pid {pid} is not a worker of this job")
        os.kill(pid, sig)

    def close(self) -> None:
        for pid in tagged_pids(self.tag):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
