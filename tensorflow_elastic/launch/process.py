"""One worker process: started in its own session, its output logged and prefixed, stopped by pid.

Each worker gets a session of its own so that a Ctrl-C in the terminal reaches
only the agent, which decides what the workers get (a forwarded SIGTERM: a
graceful leave). Output is read line by line: all of it goes to the worker's
log file, and what the console filter lets through is written with a prefix
that names the worker's node, so the interleaved output of many workers stays
readable; the last lines are kept for the failure summary.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Sequence, TextIO

from tensorflow_elastic.launch import preloaded
from tensorflow_elastic.launch.console import ConsoleFilter

OUTPUT_TAIL_LINES = 40


class WorkerProcess:
    """A started worker; ``label`` is called for every line so a node id learned later shows up.

    ``error_file`` is where the worker writes its uncaught exception ('' for none);
    ``log_file`` (if given) receives every line of its output; ``on_exit`` is called when
    its output closes, which is when it exits. With ``fork_server`` it is forked from there
    where it can be (``fresh_because`` then says why not, '' if it was).
    """

    def __init__(self, argv: list[str], env: dict[str, str], error_file: str,
                 label: Callable[[], str], stdout: TextIO | None = None,
                 stderr: TextIO | None = None, pass_fds: Sequence[int] = (),
                 log_file: str | None = None, verbose: bool = False,
                 on_exit: Callable[[], None] | None = None,
                 fork_server: preloaded.ForkServer | None = None):
        self.argv = argv
        self.error_file = error_file
        self.log_file = log_file
        self._on_exit = on_exit
        self.started_at = time.time()
        self._label = label
        self._lock = threading.Lock()
        self._log = None
        if log_file:
            os.makedirs(os.path.dirname(log_file) or ".", exist_ok=True)
            self._log = open(log_file, "a", encoding="utf-8")
        # The last lines the console showed, for the failure summary.
        self.output_tail: collections.deque[str] = collections.deque(maxlen=OUTPUT_TAIL_LINES)
        try:
            self.proc, out, err, self.fresh_because = preloaded.start(argv, env, pass_fds,
                                                                      fork_server)
        except BaseException:
            if self._log is not None:
                self._log.close()
            raise
        self._pumps = [
            threading.Thread(target=self._pump,
                             args=(out, stdout or sys.stdout, ConsoleFilter(verbose)),
                             name=f"tfe-out-{self.proc.pid}", daemon=True),
            threading.Thread(target=self._pump,
                             args=(err, stderr or sys.stderr, ConsoleFilter(verbose)),
                             name=f"tfe-err-{self.proc.pid}", daemon=True),
        ]
        for pump in self._pumps:
            pump.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    @property
    def forked(self) -> bool:
        """Whether it was forked from a fork server (not a fresh process)."""
        return isinstance(self.proc, preloaded.ForkedProcess)

    def signal(self, sig: int) -> None:
        """Sends ``sig`` to the worker itself (not its children), if it still runs."""
        self.proc.send_signal(sig)

    def stop(self, grace: float) -> int:
        """SIGTERM, then SIGKILL to the whole session after ``grace`` seconds; returns the exit code."""
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.kill()
        return self.wait_output()

    def kill(self) -> None:
        if isinstance(self.proc, preloaded.ForkedProcess):
            self.proc.kill_session()  # not between its exit's report and its reaping
        else:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.signal(signal.SIGKILL)
        self.proc.wait()

    def wait_output(self, timeout: float = 5.0) -> int:
        """Waits for the process and for its last output lines to be written; returns the exit code."""
        code = self.proc.wait()
        for pump in self._pumps:
            pump.join(timeout)
        with self._lock:
            if self._log is not None and not any(p.is_alive() for p in self._pumps):
                self._log.close()
                self._log = None
        return code

    def tail(self) -> list[str]:
        with self._lock:
            return list(self.output_tail)

    def _pump(self, stream, sink: TextIO, console: ConsoleFilter) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            shown = console.shows(line)
            with self._lock:
                if shown:
                    self.output_tail.append(line)
                if self._log is not None:
                    self._log.write(line + "\n")
                    self._log.flush()
            if shown:
                sink.write(f"[{self._label()}] {line}\n")
                sink.flush()
        stream.close()
        if self._on_exit is not None:
            # Its output closes when it exits: no need to wait for the next poll. The kernel
            # closes a killed process's files a moment (about 1 ms) before the process can be
            # reaped; a poll woken in between would see it running and miss the exit until the
            # next monitor interval.
            self._wait_until_reapable()
            self._on_exit()

    def _wait_until_reapable(self) -> None:
        """Blocks until the process has exited, without reaping it (the owner's poll does)."""
        if self.proc.returncode is not None:
            return  # reaped already
        if isinstance(self.proc, preloaded.ForkedProcess):
            self.proc.wait()  # the fork server reaps it, then reports
            return
        try:
            os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            pass  # already reaped


def stop_all(processes: Sequence[WorkerProcess], sig: int, grace: float) -> list[int]:
    """Signals every process, then waits for them under one deadline (a process still running
    after ``grace`` seconds is killed); their exit codes, in order. One deadline for all: a
    node's shutdown takes ``grace`` at most, however many processes it has."""
    for process in processes:
        process.signal(sig)
    deadline = time.monotonic() + grace
    for process in processes:
        try:
            process.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
    return [process.wait_output() for process in processes]
