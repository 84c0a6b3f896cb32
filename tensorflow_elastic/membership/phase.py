"""Where a worker stands in its job: one phase at a time, changed only along the allowed edges.

Three threads move a worker (its training thread, the heartbeat and watch
threads, the progress watchdog), so the phase is the one place that says what
the worker is doing; everything else about it (why it was removed, when) is
data that goes with the phase.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import logging
import threading
import time

from tensorflow_elastic.errors import ElasticJobFailed

logger = logging.getLogger(__name__)


class WorkerPhase(enum.Enum):
    JOINING = "joining"              # asking to join the forming job
    STANDBY = "standby"              # registered while the job runs; joins when it trains
    MEMBER = "member"                # trains in a generation
    REFORMING = "re-forming"         # moving to the next generation with the others
    STEPPED_ASIDE = "stepped aside"  # stuck outside TensorFlow: stopped heartbeating
    REMOVED = "removed"              # the job went on without this live node; it comes back
    LEAVING = "leaving"              # at the exit barrier, or leaving at a commit
    FINISHED = "finished"            # out of the job: training is over, or it left
    FAILED = "failed"                # the job cannot go on here; the reason says why


# phase -> the phases it may move to. FAILED and FINISHED are final.
ALLOWED = {
    WorkerPhase.JOINING: {WorkerPhase.MEMBER, WorkerPhase.STANDBY, WorkerPhase.FAILED},
    WorkerPhase.STANDBY: {WorkerPhase.REFORMING, WorkerPhase.LEAVING, WorkerPhase.FAILED},
    WorkerPhase.MEMBER: {WorkerPhase.REFORMING, WorkerPhase.STEPPED_ASIDE, WorkerPhase.REMOVED,
                         WorkerPhase.LEAVING, WorkerPhase.FAILED},
    WorkerPhase.REFORMING: {WorkerPhase.MEMBER, WorkerPhase.REMOVED, WorkerPhase.LEAVING,
                            WorkerPhase.FAILED},
    WorkerPhase.STEPPED_ASIDE: {WorkerPhase.MEMBER, WorkerPhase.REMOVED, WorkerPhase.REFORMING,
                                WorkerPhase.LEAVING, WorkerPhase.FAILED},
    WorkerPhase.REMOVED: {WorkerPhase.REFORMING, WorkerPhase.LEAVING, WorkerPhase.FAILED},
    WorkerPhase.LEAVING: {WorkerPhase.FINISHED, WorkerPhase.FAILED},
    WorkerPhase.FINISHED: set(),
    WorkerPhase.FAILED: set(),
}
# Every phase a worker can be in before it is out of the job.
LIVE = frozenset(phase for phase, targets in ALLOWED.items() if targets)

# Phases in which the training thread waits on the orchestrator (joins, barriers), each wait
# bounded by its own timeout: no lack of progress for the watchdog.
WAITING_ON_THE_ORCHESTRATOR = frozenset({WorkerPhase.JOINING, WorkerPhase.STANDBY,
                                         WorkerPhase.REFORMING, WorkerPhase.LEAVING})


class IllegalTransition(RuntimeError):
    """A move the protocol does not have: a bug in the worker side, never a peer's doing."""


@dataclasses.dataclass(frozen=True)
class Transition:
    """One change of phase, kept for the logs and the tests."""

    source: WorkerPhase
    target: WorkerPhase
    reason: str
    time: float


class PhaseMachine:
    """The worker's phase and its one transition method (thread-safe)."""

    HISTORY = 64  # transitions kept: enough for a test or a debug log, bounded for long jobs

    def __init__(self, node: str = "node ?"):
        self._lock = threading.Lock()
        self._phase = WorkerPhase.JOINING
        self._reason = ""
        self.node = node
        self.history: collections.deque[Transition] = collections.deque(maxlen=self.HISTORY)

    @property
    def phase(self) -> WorkerPhase:
        return self._phase

    @property
    def reason(self) -> str:
        """Why the worker entered its phase (empty where none was given)."""
        return self._reason

    def move(self, target: WorkerPhase, reason: str = "", *,
             only_from: frozenset[WorkerPhase] | set[WorkerPhase] | None = None) -> bool:
        """Moves to `target`; returns False, changing nothing, when `only_from` is given and the
        phase is not in it (a background thread's news that the training thread overtook).

        From FAILED every move raises the failure: nothing may go on after it. Any other move
        the protocol lacks raises IllegalTransition.
        """
        with self._lock:
            source = self._phase
            if only_from is not None and source not in only_from:
                return False
            if source is target:
                return True
            if source is WorkerPhase.FAILED:
                raise ElasticJobFailed(self._reason)
            if target not in ALLOWED[source]:
                raise IllegalTransition(f"{self.node}: no move from {source.value} to "
                                        f"{target.value} ({reason or 'no reason given'})")
            now = time.monotonic()
            self._phase, self._reason = target, reason
            self.history.append(Transition(source, target, reason, now))
        logger.debug("%s: %s -> %s%s", self.node, source.value, target.value,
                     f" ({reason})" if reason else "")
        return True
