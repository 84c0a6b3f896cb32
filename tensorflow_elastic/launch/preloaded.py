"""The agent's side of its fork server (launch/fork_server.py): workers started preloaded.

:class:`ForkServer` starts the server and asks it for workers; each comes back as a
:class:`ForkedProcess`, which the agent supervises as it would a ``subprocess.Popen`` (pid,
poll, wait, signals by pid): the server reports each exit, and reaps the worker only once the
agent has taken note of it, so a signal the agent sends cannot reach a process that reused
the pid. A request the server cannot serve (a command that is not a plain Python one, an
environment that differs in what is read at start-up, or one that is not valid UTF-8) is
refused, and :func:`start` starts a fresh process instead. If the server itself dies, its
workers cannot be reaped by anyone the agent hears from: they are killed and reported dead
(the agent restarts them as fresh processes), and further starts are fresh processes; so
they are after a server that did not answer in time, or that cannot fork on this host.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import IO, Sequence

from tensorflow_elastic.proto import fork_server_pb2 as pb

MAX_MESSAGE_BYTES = 1 << 20  # a request's or a reply's size, at most
READY_TIMEOUT_S = 300.0  # its imports, on a loaded machine
REPLY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 5.0


class ForkServerError(RuntimeError):
    """The fork server is not (or no longer) there; the message says what happened."""


class ForkRefused(Exception):
    """The server will not fork this worker (the reason says why): start a fresh process."""


@dataclasses.dataclass(frozen=True)
class PythonProgram:
    """What ``python [-u] SCRIPT ARGS`` or ``python [-u] -m MODULE ARGS`` runs."""

    argv: list[str]  # SCRIPT ARGS, or MODULE ARGS with module
    module: bool
    unbuffered: bool


def python_program(command: Sequence[str]) -> PythonProgram | None:
    """The program of a command this interpreter runs with no option but -u, else None."""
    if not command or command[0] != sys.executable:
        return None
    rest = list(command[1:])
    unbuffered = rest[:1] == ["-u"]
    rest = rest[unbuffered:]
    module = rest[:1] == ["-m"]
    rest = rest[module:]
    if not rest or rest[0].startswith("-"):
        return None
    return PythonProgram(rest, module, unbuffered)


class ForkedProcess:
    """A worker the fork server started, with the part of ``subprocess.Popen`` the agent uses;
    its exit is known when the server reports it."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        self._exited = threading.Event()
        # Held while signalling: the exit is noted (and the server told to reap) only between.
        self._signalling = threading.Lock()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
        return self.returncode  # type: ignore[return-value] - set before the event

    def send_signal(self, sig: int) -> None:
        """Sends ``sig`` to the worker if it still runs (as ``Popen.send_signal``)."""
        with self._signalling:
            if self.returncode is None:
                try:
                    os.kill(self.pid, sig)
                except ProcessLookupError:
                    pass

    def kill_session(self) -> None:
        """SIGKILL to the worker's session (its children too), or to the worker itself if it
        leads none yet."""
        with self._signalling:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                if self.returncode is None:
                    try:
                        os.kill(self.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass

    def _ended(self, returncode: int) -> None:
        with self._signalling:
            self.returncode = returncode
        self._exited.set()


class ForkServer:
    """A started fork server; it imports what it preloads meanwhile (the first spawn waits for
    that, up to ``ready_timeout`` seconds).

    ``env`` is its environment: the workers' without what differs from one worker to the next.
    """

    def __init__(self, env: dict[str, str], preload: Sequence[str] | None = None,
                 ready_timeout: float = READY_TIMEOUT_S):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        command = [sys.executable, "-m", "tensorflow_elastic.launch.fork_server",
                   "--fd", str(theirs.fileno())]
        if preload is not None:
            command += ["--preload", *preload]
        try:
            self.process = subprocess.Popen(command, env=env, pass_fds=[theirs.fileno()],
                                            start_new_session=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._connection = ours
        self._lock = threading.Lock()  # one request in flight at a time
        self._ids = itertools.count(1)
        self._awaited: int | None = None  # the request id spawn waits on
        self._reply: ForkedProcess | str | None = None  # its answer: started or refused
        self._replied = threading.Condition()
        self._unable: str | None = None  # why the server cannot fork, if it said so
        self._workers: dict[int, ForkedProcess] = {}
        self.lost: str | None = None  # why the server is gone, once it is
        self._ready = threading.Event()
        self._ready_timeout = ready_timeout
        threading.Thread(target=self._read, name="tfe-fork-server", daemon=True).start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def spawn(self, program: PythonProgram, env: dict[str, str], cwd: str,
              descriptors: dict[int, int], timeout: float = REPLY_TIMEOUT_S) -> ForkedProcess:
        """A worker running ``program``; ``descriptors`` maps each descriptor number it gets to
        one of ours (1 and 2: its output; 0: its input, else the server's). Raises
        ForkRefused or ForkServerError."""
        try:
            request = pb.ForkRequest(id=next(self._ids), argv=program.argv,
                                     module=program.module, unbuffered=program.unbuffered,
                                     env=env, cwd=cwd, fd_targets=list(descriptors))
        except ValueError as e:  # str fields hold UTF-8 only; a fresh process takes any bytes
            raise ForkRefused(f"its environment, arguments or working directory are not valid "
                              f"UTF-8 ({e})") from None
        data = pb.AgentMessage(fork=request).SerializeToString()
        if len(data) > MAX_MESSAGE_BYTES:
            raise ForkRefused(f"its request is {len(data)} bytes (at most {MAX_MESSAGE_BYTES})")
        if not self._ready.wait(self._ready_timeout):
            raise ForkServerError(f"the fork server (pid {self.pid}) was not ready within "
                                  f"{self._ready_timeout:.0f} s")
        with self._lock:
            with self._replied:
                if self.lost is not None:
                    raise ForkServerError(self.lost)
                self._awaited = request.id
            try:
                socket.send_fds(self._connection, [data], list(descriptors.values()))
            except OSError as e:
                self._awaited = None
                raise ForkServerError(f"the fork server (pid {self.pid}) cannot be reached: "
                                      f"{e}") from None
            with self._replied:
                answered = self._replied.wait_for(
                    lambda: self._reply is not None or self.lost is not None, timeout)
                reply, self._reply, self._awaited = self._reply, None, None
                if not answered:
                    # A late answer's worker is killed (_read): no second copy of a worker that
                    # starts fresh now. A server this slow serves no more.
                    self.lost = (f"the fork server (pid {self.pid}) did not answer within "
                                 f"{timeout:.0f} s; workers start as fresh processes from now on")
                    raise ForkServerError(self.lost)
        if reply is None:
            raise ForkServerError(self.lost)
        if isinstance(reply, str):
            raise ForkRefused(reply)
        return reply

    def close(self) -> None:
        """Hangs up: the server ends, and so do the workers still tracked (killed, as when the
        server dies: the agent stops its workers before this)."""
        try:
            self._connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # it is gone already
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._connection.close()

    def _read(self) -> None:
        while True:
            try:
                data = self._connection.recv(MAX_MESSAGE_BYTES)
            except OSError:
                data = b""
            if not data:
                self._server_gone()
                return
            message = pb.ServerMessage.FromString(data)
            kind = message.WhichOneof("kind")
            if kind == "ready":
                self._ready.set()
            elif kind == "unable":
                self._unable = message.unable.reason
            elif kind == "exited":
                worker = self._workers.pop(message.exited.pid, None)
                if worker is not None:
                    worker._ended(message.exited.returncode)
                self._send_reap(message.exited.pid)  # no signal of ours reaches it any more
            elif kind == "started":
                worker = ForkedProcess(message.started.pid)
                self._workers[worker.pid] = worker
                if not self._answer(message.started.id, worker):
                    worker.kill_session()  # too late: it was started fresh instead
            else:
                self._answer(message.refused.id, message.refused.reason)

    def _answer(self, request_id: int, reply: ForkedProcess | str) -> bool:
        """Hands ``reply`` to the spawn waiting for it; False if none is waiting any more."""
        with self._replied:
            if request_id != self._awaited:
                return False
            self._reply = reply
            self._replied.notify_all()
            return True

    def _send_reap(self, pid: int) -> None:
        try:
            self._connection.send(pb.AgentMessage(reap=pb.Reap(pid=pid)).SerializeToString())
        except OSError:
            pass  # the server is gone: nothing of it is left to reap

    def _server_gone(self) -> None:
        """Its workers can no longer be reaped for us: they are killed and reported dead. (A
        worker that exits in the moment after the server died is reaped by init, and its pid
        could be reused before it is killed here; the server's death is the rare case.)"""
        code = self.process.wait()
        if self._unable is not None:
            why = f"cannot fork on this host: {self._unable}"
        else:
            early = "" if self._ready.is_set() else " before it was ready (its output says why)"
            why = f"exited with code {code}{early}"
        with self._replied:
            self.lost = (f"the fork server (pid {self.pid}) {why}; workers start as fresh "
                         f"processes from now on")
            self._replied.notify_all()
        for worker in list(self._workers.values()):
            worker.kill_session()
            worker._ended(-signal.SIGKILL)
        self._workers.clear()
        self._ready.set()


def start(argv: list[str], env: dict[str, str], pass_fds: Sequence[int],
          server: ForkServer | None) -> tuple[subprocess.Popen | ForkedProcess, IO[bytes],
                                              IO[bytes], str]:
    """A worker running ``argv`` in ``env`` with ``pass_fds``, in a session of its own, its
    output on two pipes: forked from ``server`` where it can be, else a fresh process.
    Returns (the process, its stdout, its stderr, why it is a fresh process: '' if forked)."""
    program = python_program(argv) if server is not None else None
    why = "no fork server" if server is None else (
        "" if program else "not a plain Python command")
    if program is not None:
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        try:
            process = server.spawn(program, env, os.getcwd(),
                                   {1: out_write, 2: err_write, **{fd: fd for fd in pass_fds}})
            return process, os.fdopen(out_read, "rb"), os.fdopen(err_read, "rb"), ""
        except BaseException as e:
            os.close(out_read)
            os.close(err_read)
            if not isinstance(e, (ForkRefused, ForkServerError)):
                raise
            why = str(e)
        finally:
            os.close(out_write)
            os.close(err_write)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, pass_fds=tuple(pass_fds))
    return proc, proc.stdout, proc.stderr, why  # type: ignore[return-value] - pipes asked for
