"""A launcher's fork server: one process per agent that imports TensorFlow and this package once,
then forks every worker from there, so a worker (a replacement above all) starts without paying
TensorFlow's import (seconds) again.

``python -m tensorflow_elastic.launch.fork_server --fd N`` serves the agent on Unix socket N
(fork_server.proto; launch/preloaded.py is the agent's side). A fork copies only the thread
that forks, so the server creates no TensorFlow runtime (no eager context, no thread pools) and
checks that it has exactly one thread before each fork. A forked worker gets the environment,
working directory, argv and descriptors the agent asks for, its own session, fresh standard
streams, and runs its program as ``__main__`` (runpy), then exits as the interpreter would
(threads joined, exit handlers run). What a process reads only at its start or at import (the
interpreter's, the C library's, TensorFlow's logging variables) cannot change after the fork: a
worker whose environment differs from the server's there is refused, and the agent starts it
as a fresh process. The server reports each worker's exit and reaps the worker once the agent
has heard of it; it ends when the agent closes its end of the socket. It needs pidfds (Linux
5.3 and later): without them it says so and exits, and the workers start as fresh processes.
"""

from __future__ import annotations

import argparse
import atexit
import fcntl
import gc
import importlib
import io
import os
import runpy
import select
import signal
import socket
import sys
import threading
import traceback

from tensorflow_elastic.launch.preloaded import MAX_MESSAGE_BYTES
from tensorflow_elastic.proto import fork_server_pb2 as pb

# What the server imports before it forks: TensorFlow and the parts of the package a worker
# loads (not the launcher's bootstrap, which runs as each worker's __main__).
PRELOAD = ("tensorflow", "tensorflow_elastic.strategy", "tensorflow_elastic.training.state",
           "tensorflow_elastic.training.loop", "tensorflow_elastic.training.warm_up",
           "tensorflow_elastic.launch.error_files")
# Variables read at a process's start or at import: a worker must have the server's values.
STARTUP_VARIABLES = ("PYTHON", "LD_", "GLIBC_", "MALLOC_", "TF_CPP_", "TF_ENABLE_", "OMP_",
                     "OPENBLAS_", "MKL_", "KMP_")
MAX_DESCRIPTORS = 64


def startup_differences(env: dict[str, str], own: dict[str, str]) -> list[str]:
    """The variables read at start-up or import whose value in ``env`` differs from ``own``."""
    names = {n for n in (*env, *own) if n.startswith(STARTUP_VARIABLES)}
    return sorted(n for n in names if env.get(n) != own.get(n))


def threads() -> list[str]:
    """The names of this process's threads (the kernel's view: native threads too)."""
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm", encoding="utf-8") as f:
                names.append(f.read().strip())
        except OSError:
            pass  # it ended meanwhile
    return names


def check_one_thread() -> None:
    running = threads()
    if len(running) != 1:
        raise RuntimeError(
            f"the fork server has {len(running)} threads ({', '.join(running)}) where a fork "
            f"copies only one: something it imported started threads; run the workers "
            f"without --fork_server")


def settle() -> None:
    """Stops the native pools that stop themselves at a fork (OpenBLAS's, which numpy starts
    at import and restarts on its next use) with a fork of a child that exits at once; then
    the server must have one thread."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    check_one_thread()


def serve(connection: socket.socket) -> None:
    """Forks a worker for each request and reports each exit, until the agent hangs up. An
    exited worker is reaped only when the agent says it heard of the exit: until then its pid
    is not free, so no signal the agent sends meanwhile can reach another process."""
    children: dict[int, int] = {}  # pidfd -> pid, of the running workers
    exited: set[int] = set()  # reported, not yet reaped
    poller = select.poll()
    poller.register(connection.fileno(), select.POLLIN)
    while True:
        for fd, _ in poller.poll():
            if fd != connection.fileno():
                pid = children.pop(fd)
                poller.unregister(fd)
                result = os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOWAIT)
                os.close(fd)
                exited.add(pid)
                _send(connection, pb.ServerMessage(exited=pb.Exited(
                    pid=pid, returncode=_returncode(result))))
                continue
            data, descriptors, _, _ = socket.recv_fds(connection, MAX_MESSAGE_BYTES,
                                                      MAX_DESCRIPTORS)
            if not data:
                return
            message = pb.AgentMessage.FromString(data)
            if message.WhichOneof("kind") == "reap":
                if message.reap.pid in exited:
                    exited.remove(message.reap.pid)
                    os.waitpid(message.reap.pid, 0)
                continue
            request = message.fork
            try:
                pid = _fork(connection, request, descriptors)
            except Exception as e:  # noqa: BLE001 - the agent starts it fresh instead
                _send(connection, pb.ServerMessage(refused=pb.Refused(id=request.id,
                                                                      reason=str(e))))
                continue
            finally:
                for descriptor in descriptors:
                    os.close(descriptor)
            try:
                pidfd = os.pidfd_open(pid)
            except OSError as e:  # a worker no one could reap or report: it must not run
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                _send(connection, pb.ServerMessage(refused=pb.Refused(
                    id=request.id, reason=f"the fork server cannot watch its worker: {e}")))
                continue
            children[pidfd] = pid
            poller.register(pidfd, select.POLLIN)
            _send(connection, pb.ServerMessage(started=pb.Started(id=request.id, pid=pid)))


def _returncode(result: os.waitid_result) -> int:
    """A child's exit as subprocess reports it (-N: killed by signal N)."""
    if result.si_code == os.CLD_EXITED:
        return result.si_status
    return -result.si_status


def check_pidfds() -> None:
    """The server watches its workers through pidfds (Linux 5.3 and later)."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (OSError, AttributeError) as e:
        raise RuntimeError(f"the fork server needs pidfd_open (Linux 5.3 or later; this kernel "
                           f"is {os.uname().release}): {e}; run the workers without "
                           f"--fork_server") from None


def _fork(connection: socket.socket, request: pb.ForkRequest, descriptors: list[int]) -> int:
    differences = startup_differences(dict(request.env), dict(os.environ))
    if differences:
        raise ValueError(f"its environment differs from the fork server's in variables read "
                         f"at start-up or import: {', '.join(differences)}")
    if len(descriptors) != len(request.fd_targets):
        raise ValueError(f"{len(descriptors)} descriptors passed for "
                         f"{len(request.fd_targets)} targets")
    check_one_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            code = _become_worker(connection, request, descriptors)
        except BaseException:  # noqa: BLE001 - its setup failed: say why, exit as a failure
            traceback.print_exc()
            code = 1
        _flush_standard_streams()
        os._exit(code)
    return pid


def _become_worker(connection: socket.socket, request: pb.ForkRequest,
                   descriptors: list[int]) -> int:
    """In the forked child: becomes the worker the request describes and runs its program;
    returns its exit code."""
    connection.detach()  # closed below with every other descriptor the worker was not given
    os.setsid()
    _place_descriptors(descriptors, list(request.fd_targets))
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)
    _reopen_standard_streams(request.unbuffered)
    _reseed_numpy()
    sys.argv = list(request.argv)
    # As `python SCRIPT` (`python -m MODULE`): its directory (the working directory) first.
    sys.path[0] = os.getcwd() if request.module else os.path.dirname(os.path.abspath(sys.argv[0]))
    try:
        if request.module:
            runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(sys.argv[0], run_name="__main__")
        code = 0
    except SystemExit as e:
        code = _exit_code(e)
    except KeyboardInterrupt:
        _finish_interpreter()
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # as Python does: die of the signal
        os.kill(os.getpid(), signal.SIGINT)
        code = 130
    except BaseException:  # noqa: BLE001 - uncaught: shown (and recorded) as Python would
        sys.excepthook(*sys.exc_info())
        code = 1
    _finish_interpreter()
    return code


def _place_descriptors(received: list[int], targets: list[int]) -> None:
    """Gives the worker each received descriptor under its target number and closes every
    other one but stdin (the server's own, its socket, other workers' pidfds)."""
    floor = max([*received, *targets, 2]) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor) for fd in received]
    for fd, target in zip(moved, targets):
        os.dup2(fd, target)  # inheritable, as a subprocess's pass_fds are
    keep = sorted({t for t in targets if t > 2})
    low = 3
    for fd in keep:
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))


def _reopen_standard_streams(unbuffered: bool) -> None:
    """sys.stdin/stdout/stderr over the worker's descriptors 0-2, buffered as a new
    interpreter's would be (with -u: unbuffered)."""
    try:
        stdin = open(0, "r", closefd=False, encoding=getattr(sys.stdin, "encoding", None),
                     errors=getattr(sys.stdin, "errors", None))
    except OSError:  # no descriptor 0: as in an interpreter started without one
        stdin = None
    sys.stdin = sys.__stdin__ = stdin
    for fd, name in ((1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        raw = io.FileIO(fd, "w", closefd=False)
        binary = raw if unbuffered else io.BufferedWriter(raw)
        stream = io.TextIOWrapper(binary, encoding=old.encoding, errors=old.errors,
                                  line_buffering=name == "stderr" or raw.isatty(),
                                  write_through=unbuffered)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _reseed_numpy() -> None:
    """numpy's global generator, seeded at its import, would give every worker the server's
    numbers (Python's random module reseeds itself at a fork)."""
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


def _exit_code(exit: SystemExit) -> int:
    """The exit code Python gives sys.exit(code)."""
    if exit.code is None:
        return 0
    if isinstance(exit.code, int):
        return exit.code & 0xFF
    print(exit.code, file=sys.stderr)
    return 1


def _finish_interpreter() -> None:
    """What an interpreter does at its end before the process exits: waits for non-daemon
    threads, runs the exit handlers, flushes its streams."""
    threading._shutdown()  # type: ignore[attr-defined] - the interpreter's own step
    atexit._run_exitfuncs()
    _flush_standard_streams()


def _flush_standard_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # closed, or its reader went away


def _send(connection: socket.socket, message: pb.ServerMessage) -> None:
    connection.send(message.SerializeToString())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fd", type=int, required=True,
                        help="the agent's Unix socket (SOCK_SEQPACKET), passed down open")
    parser.add_argument("--preload", nargs="*", default=list(PRELOAD),
                        help="modules imported before the first fork")
    args = parser.parse_args(argv)
    connection = socket.socket(fileno=args.fd)
    for module in args.preload:
        importlib.import_module(module)
    # What the imports made lives as long as a worker: its collections need not walk it (and
    # so touch, and copy, every page of it).
    gc.freeze()
    try:
        settle()
        check_pidfds()
    except RuntimeError as e:
        print(f"fork server: {e}", file=sys.stderr)
        _send(connection, pb.ServerMessage(unable=pb.Unable(reason=str(e))))
        return 1
    try:
        _send(connection, pb.ServerMessage(ready=pb.Ready(pid=os.getpid())))
        serve(connection)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the agent hung up while a worker's exit was being reported
    return 0


if __name__ == "__main__":
    sys.exit(main())
