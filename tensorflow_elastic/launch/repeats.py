"""Whether a restart would only repeat a failure: a user error ends the job, a crash is restarted.

A script with a bad import, a wrong flag or a missing file fails the same way
in every worker before the job's first step, and again after every restart;
restarting it only spends ``--max_restarts``. Two failures are the same when
they have one *signature*: the exception's type, message and traceback from
the worker's error file, or, without one, the exit code and the last output
line. Failures a restart may well cure have none: a signal (OOM, preemption,
SIGKILL) and the errors of a lost peer, connection or timeout. TensorFlow names
the device an op ran on in its errors, with the worker's task: that is left out.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

from tensorflow_elastic.launch.error_files import WorkerFailure

# Exception types (by name, as error files hold them) that a lost peer or a network causes.
TRANSIENT_ERRORS = frozenset({
    # TensorFlow's, from collectives and RPCs when a peer goes away
    "AbortedError", "CancelledError", "DeadlineExceededError", "InternalError",
    "UnavailableError", "UnknownError", "ResourceExhaustedError",
    # Python's
    "ConnectionError", "ConnectionAbortedError", "ConnectionRefusedError",
    "ConnectionResetError", "BrokenPipeError", "TimeoutError", "MemoryError",
    # the orchestrator's (tensorflow_elastic.rendezvous.errors) and the job's end
    "RendezvousError", "GenerationChangedError", "NodeRemovedError", "RunFailedError",
    "RendezvousTimeoutError", "OrchestratorUnreachableError", "NotLeaderError",
    "ElasticJobFailed", "MembershipChanged",
})

# A device in TensorFlow's error messages: "/job:worker/replica:0/task:3/device:CPU:0".
_DEVICE_TASK = re.compile(r"(/job:[^/\s]+/replica:\d+/task:)\d+")

# How long workers that failed wait for the others still running, before they are restarted.
WAIT_FOR_OTHERS_S = 10.0


@dataclasses.dataclass(frozen=True)
class UserError:
    """A failure a restart would repeat: the job ends with it."""

    failure: WorkerFailure
    why: str

    @property
    def exit_code(self) -> int:
        return self.failure.exit_code


def signature(failure: WorkerFailure) -> tuple | None:
    """What two identical failures share; None for one a restart may cure."""
    if failure.exit_code <= 0:
        return None  # killed by a signal
    if failure.error_type:
        if failure.error_type in TRANSIENT_ERRORS:
            return None
        return (failure.exit_code, failure.error_type, _any_task(failure.message),
                _any_task(failure.traceback))
    last_line = next((line for line in reversed(failure.output_tail) if line.strip()), "")
    return failure.exit_code, "", _any_task(last_line), ""


def _any_task(text: str) -> str:
    """`text` with the task of every TensorFlow device in it left out: each worker is a task."""
    return _DEVICE_TASK.sub(r"\1*", text)


def user_error(exit_codes: Sequence[int | None], failures: Sequence[WorkerFailure]
               ) -> UserError | None:
    """The user error among this node's failures (``failures`` oldest first), if there is one.

    Either every worker (two or more: one alone proves nothing) is down, each last with the
    same failure before the job's first step; or a worker's last failure repeats its
    previous one with no step in between.
    """
    last: dict[int, WorkerFailure] = {}
    before: dict[int, WorkerFailure] = {}
    for failure in failures:
        if failure.local_rank in last:
            before[failure.local_rank] = last[failure.local_rank]
        last[failure.local_rank] = failure
    if len(exit_codes) > 1 and all(code not in (None, 0) for code in exit_codes) \
            and len(last) == len(exit_codes):
        first = min(last.values(), key=lambda f: f.time)
        if first.step is None and _all_same(list(last.values())):
            return UserError(first, "every worker failed the same way before the first step")
    for rank, failure in last.items():
        previous = before.get(rank)
        if previous is not None and previous.step == failure.step \
                and _all_same([previous, failure]):
            return UserError(failure, f"worker {rank} failed again exactly as before, with no "
                                      f"step in between")
    return None


def waits_for_others(exit_codes: Sequence[int | None], pending: Sequence[WorkerFailure],
                     now: float) -> bool:
    """Whether the failed workers should wait before they are restarted: they failed the same
    way before the first step while others still run, which may yet fail so too."""
    if not pending or all(code is not None for code in exit_codes) \
            or any(code == 0 for code in exit_codes):
        return False
    first = min(pending, key=lambda f: f.time)
    return (first.step is None and _all_same(list(pending))
            and now - first.time < WAIT_FOR_OTHERS_S)


def _all_same(failures: list[WorkerFailure]) -> bool:
    signatures = {signature(f) for f in failures}
    return len(signatures) == 1 and None not in signatures
