"""Why a worker failed: error files written by the worker, read back by its agent.

A worker that dies of an uncaught exception leaves a JSON error file (the
path is in ``TFE_ERROR_FILE``) with the exception and its traceback, so the
agent can name the first failure of a run instead of leaving the user to dig
through interleaved logs. Workers started by the agent get this
automatically (see :mod:`tensorflow_elastic.launch.bootstrap`); a script run
some other way can decorate its entry point with :func:`record`. A worker
that dies without one (a signal, a segfault, ``sys.exit(1)``) is described
from its exit code and the tail of its output.

An exception whose class sets ``restartable = False`` (e.g.
:class:`tensorflow_elastic.errors.TrainingDiverged`) is a way the job ends by
design, not a crash: its file says so, the agent does not restart the
worker, and its message, which says what to change, is shown without a
traceback.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import signal
import sys
import time
import traceback
from typing import Any, Callable, TypeVar

from tensorflow_elastic import environment

TAIL_LINES = 15

F = TypeVar("F", bound=Callable[..., Any])


def write_error_file(error: BaseException, path: str | None = None) -> None:
    """Writes ``error`` and its traceback to ``path`` (default: ``$TFE_ERROR_FILE``); no-op without one."""
    path = path or environment.text(environment.ERROR_FILE)
    if not path:
        return
    record = {
        "type": type(error).__name__,
        "message": str(error),
        "restartable": restartable(error),
        "traceback": "".join(traceback.format_exception(type(error), error, error.__traceback__)),
        "time": time.time(),
        "pid": os.getpid(),
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.replace(tmp, path)


def restartable(error: BaseException) -> bool:
    """False for an error a restart cannot fix (its class says ``restartable = False``)."""
    return bool(getattr(error, "restartable", True))


def record(func: F) -> F:
    """Decorates a worker's entry point: an uncaught exception goes to the error file, then on."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except SystemExit:
            raise
        except BaseException as error:
            write_error_file(error)
            raise

    return wrapper  # type: ignore[return-value]


def install_excepthook() -> None:
    """Makes every uncaught exception of this process's main thread leave an error file."""
    previous = sys.excepthook

    def hook(exc_type: type[BaseException], error: BaseException, tb: Any) -> None:
        if not issubclass(exc_type, (SystemExit, KeyboardInterrupt)):
            write_error_file(error.with_traceback(tb))
        if restartable(error):
            previous(exc_type, error, tb)
        else:  # the message is what the user needs; the traceback stays in the error file
            print(f"{exc_type.__name__}: {error}", file=sys.stderr, flush=True)

    sys.excepthook = hook


@dataclasses.dataclass
class WorkerFailure:
    """One failed worker process, as the root-cause summary shows it.

    ``name`` is what the summary calls the worker when its mode names workers by role (the
    parameter-server mode); otherwise its node id names it.
    """

    local_rank: int
    node_id: int | None
    pid: int
    exit_code: int
    time: float
    error_type: str = ""
    message: str = ""
    traceback: str = ""
    output_tail: list[str] = dataclasses.field(default_factory=list)
    log_file: str | None = None
    restartable: bool = True
    name: str | None = None
    step: int | None = None  # the job's newest recorded step when it failed (None: before the first)

    @property
    def exit_reason(self) -> str:
        if self.exit_code < 0:
            try:
                return f"killed by {signal.Signals(-self.exit_code).name}"
            except ValueError:
                return f"killed by signal {-self.exit_code}"
        return f"exit code {self.exit_code}"

    @property
    def cause(self) -> str:
        """One line: what ended the process."""
        if self.error_type:
            return f"{self.exit_reason}: {self.error_type}: {self.message}".strip()
        return self.exit_reason

    @property
    def brief(self) -> str:
        """The cause, without a message the worker printed itself (an error that ends the job by
        design says what to change once, not on every line about it)."""
        if self.restartable or not self.error_type:
            return self.cause
        return f"{self.exit_reason}: {self.error_type}"

    @classmethod
    def collect(cls, local_rank: int, node_id: int | None, pid: int, exit_code: int,
                error_file: str, output_tail: list[str], log_file: str | None = None,
                name: str | None = None, step: int | None = None) -> "WorkerFailure":
        """Reads the worker's error file if it wrote one; its output tail stands in otherwise."""
        failure = cls(local_rank, node_id, pid, exit_code, time.time(),
                      output_tail=list(output_tail), log_file=log_file, name=name, step=step)
        try:
            with open(error_file, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            return failure
        failure.error_type = str(data.get("type", ""))
        failure.message = str(data.get("message", ""))
        failure.traceback = str(data.get("traceback", ""))
        failure.time = float(data.get("time", failure.time))
        failure.restartable = bool(data.get("restartable", True))
        return failure


def root_cause_summary(failures: list[WorkerFailure], title: str) -> str:
    """The first failure in full (its traceback's tail, unless its message is all there is to
    say), then one line per later failure."""
    if not failures:
        return title
    ordered = sorted(failures, key=lambda f: f.time)
    first = ordered[0]
    rule = "=" * 72
    who = (f"  worker:     {first.name}" if first.name
           else f"  node:       {_node_id(first)}")
    lines = [rule, title, rule, "Root cause (first failure):", who,
             f"  local rank: {first.local_rank}",
             f"  pid:        {first.pid}",
             f"  time:       {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(first.time))}",
             f"  cause:      {first.cause}"]
    if not first.restartable:
        tail = []  # the message says it all
    elif first.traceback:
        tail = first.traceback.rstrip().splitlines()[-TAIL_LINES:]
    else:
        tail = [line.rstrip("\n") for line in first.output_tail[-TAIL_LINES:]]
    if tail:
        lines.append("  traceback:" if first.traceback else "  last output:")
        lines += [f"    {line}" for line in tail]
    if first.log_file:
        lines.append(f"  full output: {first.log_file}")
    if len(ordered) > 1:
        lines.append("Other failures:")
        lines += [f"  {_who(f)} (local rank {f.local_rank}, pid {f.pid}): {f.brief}"
                  for f in ordered[1:]]
    lines.append(rule)
    return "\n".join(lines)


def _node_id(failure: WorkerFailure) -> str:
    return "unknown (it had not joined)" if failure.node_id is None else str(failure.node_id)


def _who(failure: WorkerFailure) -> str:
    return failure.name or f"node {_node_id(failure)}"
