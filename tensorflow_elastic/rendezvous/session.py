"""A worker's membership: its node id, its generation, and the re-form protocol it follows.

TensorFlow-free, so the protocol is testable without a cluster. A node that
arrives while a job runs registers (gets its permanent id) without joining
yet, so it can build its model and trace its functions while the members keep
training; it joins when training starts.

Two threads keep the view current: heartbeats (liveness, nodes waiting to
join) and the orchestrator's watch stream. What follows from a change is left
to listeners: `on_peers_lost` (unblock whatever waits on a lost peer) and
`on_regroup` (move to the new generation's members before its barrier).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from tensorflow_elastic import environment
from tensorflow_elastic.errors import ElasticJobFailed, GenerationEnded
from tensorflow_elastic.observability import events
from tensorflow_elastic.observability.steps import StepReporter
from tensorflow_elastic.rendezvous.client import Client
from tensorflow_elastic.rendezvous.errors import (UNKNOWN_RUN, GenerationChangedError,
                                                  OrchestratorUnreachableError, RendezvousError,
                                                  RunFailedError)
from tensorflow_elastic.rendezvous.types import Membership, Phase

logger = logging.getLogger(__name__)

DEFAULT_JOIN_TIMEOUT_S = 600.0
DEFAULT_BARRIER_TIMEOUT_S = 120.0
DEFAULT_PROGRESS_TIMEOUT_S = 600.0
# How long a worker waits for an orchestrator that does not answer (environment.ORCHESTRATOR_WAIT).
DEFAULT_ORCHESTRATOR_WAIT_S = 60.0
HEARTBEAT_INTERVAL_S = 0.5

PeersLostListener = Callable[[str], None]
RegroupListener = Callable[[Membership], None]


class MembershipSession:
    """One node's membership of an elastic job, and the re-form protocol every member follows."""

    def __init__(self, client: Client, address: str, min_nodes: int, max_nodes: int,
                 join_timeout: float = DEFAULT_JOIN_TIMEOUT_S,
                 progress_timeout: float = DEFAULT_PROGRESS_TIMEOUT_S, step_events_every: int = 10):
        if not 1 <= min_nodes <= max_nodes:
            raise ValueError(f"need 1 <= min_nodes <= max_nodes, got {min_nodes}:{max_nodes}")
        self.client = client
        self.address = address
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes
        self.join_timeout = join_timeout
        self.events = events.EventLog(source="worker")
        self._steps = StepReporter(every=step_events_every)
        # The watchdog: no commit for this long while training tells the
        # listeners that peers are lost, so a hang nobody detected still ends in an error.
        self.progress_timeout = progress_timeout
        self._last_progress: float | None = None
        self.membership: Membership | None = None
        self.standby = False
        self._waiting = 0
        self._leave_requested = threading.Event()
        self._unplanned_change = threading.Event()
        self._reforming = threading.Event()
        self._failure_reason = ""
        self._watch_thread: threading.Thread | None = None
        self._peers_lost_listeners: list[PeersLostListener] = []
        self._regroup_listeners: list[RegroupListener] = []

    # ---------------------------------------------------------------- listeners

    def on_peers_lost(self, listener: PeersLostListener) -> None:
        """`listener(reason)` runs (on a background thread) when peers may be gone."""
        self._peers_lost_listeners.append(listener)

    def on_regroup(self, listener: RegroupListener) -> None:
        """`listener(membership)` runs at every re-form, before the new generation's barrier."""
        self._regroup_listeners.append(listener)

    # ---------------------------------------------------------------- joining

    def start(self) -> None:
        """Joins the forming job, or registers as a standby node when the job already runs."""
        try:
            running = self.client.status()[0].state == Phase.ACTIVE
        except RendezvousError as e:
            if e.reason != UNKNOWN_RUN:
                raise
            running = False
        if running:
            self.client.register(self.address, self.min_nodes, self.max_nodes)
            self.standby = True
            logger.info("node %d registered; joins when training starts", self.client.node_id)
        else:
            self._join()

    def start_watching(self) -> None:
        """Starts the heartbeat and watch threads."""
        self.client.start_heartbeats(HEARTBEAT_INTERVAL_S, self._on_heartbeat,
                                     self._on_heartbeats_stopped)
        self._watch_thread = threading.Thread(target=self._watch, name="tfe-watch", daemon=True)
        self._watch_thread.start()

    @property
    def node_id(self) -> int:
        return self.client.node_id

    @property
    def generation(self) -> int:
        return 0 if self.membership is None else self.membership.generation

    def initial_cluster(self) -> tuple[int, dict[int, str], int]:
        """(node id, members, generation) for the first server: a standby node is alone."""
        if self.standby:
            return self.node_id, {self.node_id: self.address}, 0
        return self.node_id, dict(self.membership.members), self.membership.generation

    def _join(self) -> None:
        """Blocks until this node is a member of a generation newer than its last one."""
        try:
            self.membership = self.client.join(self.address, self.min_nodes, self.max_nodes,
                                               timeout=self.join_timeout)
        except RunFailedError as e:
            raise ElasticJobFailed(f"the elastic job cannot continue: {e.message}") from None
        self._unplanned_change.clear()
        if self.standby or not self._regroup_listeners:
            self.events.record(events.RENDEZVOUS_COMPLETE, node=self.node_id,
                               generation=self.membership.generation,
                               members=sorted(self.membership.members),
                               world_size=self.membership.world_size)
        self.standby = False

    # ----------------------------------------------------------- re-forming

    def enter_training(self) -> None:
        """A standby node joins now (blocking until the members admit it at a commit)."""
        if self.standby:
            self.reform()

    def reform(self) -> None:
        """Moves to the next generation with the members still there; every member calls it.

        The membership may move on while members gather (a leaver's departure
        lands after the others re-joined, a second failure): then the barrier
        fails with GenerationChangedError and the node follows to the newer one.
        """
        self._reforming.set()
        try:
            while True:
                self._join()
                try:
                    self._regroup()
                    return
                except GenerationChangedError:
                    logger.info("generation %d ended while forming; joining the next one",
                                self.generation)
        except OrchestratorUnreachableError as e:
            raise ElasticJobFailed(_orchestrator_lost("re-form", e)) from None
        finally:
            self._reforming.clear()

    def _regroup(self) -> None:
        membership = self.membership
        for listener in self._regroup_listeners:
            listener(membership)
        self.client.barrier(f"generation-{membership.generation}", timeout=DEFAULT_BARRIER_TIMEOUT_S)
        self.events.record(events.GENERATION_START, node=self.node_id,
                           generation=membership.generation, members=sorted(membership.members),
                           world_size=membership.world_size, chief=membership.chief_id)

    def finish_step_together(self) -> None:
        """At a planned change: returns once every member has finished the step.

        TensorFlow's collectives pull their buffers from the peers, so a member
        that left (or updated its server) while a slower one was still pulling
        the step's last buffers from it would fail that step. A failure while
        members gather is left to the re-form that follows.
        """
        self._reforming.set()
        try:
            self.client.barrier(f"change-{self.generation}", timeout=DEFAULT_BARRIER_TIMEOUT_S)
        except GenerationChangedError:
            logger.info("generation %d ended while its members finished the step", self.generation)
        finally:
            self._reforming.clear()

    def exchange(self, topic: str, value: bytes) -> dict[int, bytes]:
        """Every current member's `value` for `topic`, by node id (a small all-gather).

        Raises GenerationEnded when a member is lost while the others gather.
        """
        try:
            return self.client.synchronize(f"{topic}-{self.generation}", value)
        except GenerationChangedError as e:
            raise GenerationEnded(str(e)) from None

    def wants_reform(self) -> bool:
        """This member's vote at a commit: nodes wait to join, it is leaving, or the group changed."""
        world = 0 if self.membership is None else self.membership.world_size
        return (self._leave_requested.is_set() or self._unplanned_change.is_set()
                or (self._waiting > 0 and world < self.max_nodes))

    @property
    def leave_requested(self) -> bool:
        return self._leave_requested.is_set()

    def request_leave(self) -> None:
        """Asks to leave at the next commit (e.g. on SIGTERM, a preemption notice)."""
        self._leave_requested.set()

    def leave(self, reason: str) -> None:
        self.events.record(events.NODE_LEFT, node=self.node_id, generation=self.generation,
                           reason=reason)
        self.close()  # first: a heartbeat after the leave would find the node gone
        self.client.leave(reason)

    def report_step(self, step: int) -> None:
        """Notes progress for the watchdog; a `step` event every `step_events_every` commits."""
        self._last_progress = time.monotonic()
        if self._steps.due(step):
            self._steps.report(step, self.membership.world_size, node=self.node_id,
                               generation=self.generation)

    def report_failure(self, peers: list[int], reason: str, detail: str) -> None:
        """Records the failure and tells the orchestrator which peers this node cannot reach."""
        self.events.record(events.FAILURE_DETECTED, node=self.node_id, generation=self.generation,
                           failed=peers, cause=f"{reason}: {detail[:200]}")
        if peers:
            try:
                self.client.report_failure(peers, reason=reason)
            except GenerationChangedError:
                pass  # another member's report already started the next generation
            except OrchestratorUnreachableError as e:
                raise ElasticJobFailed(_orchestrator_lost("re-form", e)) from None

    def finish(self, step: int) -> None:
        """The exit barrier (every member has returned from training at `step`), then a clean leave.

        Leaving at once keeps the orchestrator from taking finished members for
        failed ones when their heartbeats stop. Training is over either way: when
        the orchestrator cannot be reached, it returns with a warning, so that the
        code after training (saving the model) runs.
        """
        self._reforming.set()
        reachable = True
        try:
            self.client.barrier(f"exit-{self.generation}", timeout=DEFAULT_BARRIER_TIMEOUT_S)
        except GenerationChangedError:
            # A member was lost after training: every step is done, nobody pulls buffers now.
            logger.info("generation %d ended at the exit barrier", self.generation)
        except OrchestratorUnreachableError as e:
            reachable = False
            logger.warning("training finished at step %d, but %s; returning without the exit "
                           "barrier and the leave", step, e.message)
        self.events.record(events.JOB_COMPLETE, node=self.node_id, generation=self.generation,
                           step=step)
        self.close()  # first: a heartbeat after the leave would find the node gone
        if not reachable:
            return
        try:
            self.client.leave("job complete")
        except RendezvousError as e:
            logger.info("leave after the job: %s", e)

    def close(self) -> None:
        self.client.stop_heartbeats()

    def check_job_alive(self) -> None:
        if self._failure_reason:
            raise ElasticJobFailed(self._failure_reason)

    # ------------------------------------------------------------ background

    def _on_heartbeat(self, info) -> None:
        self._waiting = info.waiting
        if (self._last_progress is not None and not self._reforming.is_set()
                and time.monotonic() - self._last_progress > self.progress_timeout):
            self._last_progress = time.monotonic()
            self._tell_peers_lost(
                f"no commit for {self.progress_timeout:g} s ({environment.PROGRESS_TIMEOUT}); a "
                f"peer may hang without having failed")
        if info.state == Phase.FAILED:
            self._failure_reason = "the orchestrator ended the run"
            self._note_unplanned_change("run failed")
        elif self.membership is not None and not self.standby \
                and info.generation > self.membership.generation:
            self._note_unplanned_change(f"generation {info.generation} started")

    def _on_heartbeats_stopped(self, error: Exception) -> None:
        """This node can no longer prove it is alive (it was removed, the run failed, a bug):
        training here must end with that reason, not hang on peers that moved on."""
        reason = getattr(error, "message", None) or str(error)
        logger.error("heartbeats to the orchestrator stopped: %s", reason)
        self._failure_reason = f"this node lost its place in the job: {reason}"
        self._tell_peers_lost(f"heartbeats stopped: {reason}")

    def _watch(self) -> None:
        try:
            for update in self.client.watch():
                self._waiting = update.waiting
                if update.state == Phase.FAILED:
                    self._failure_reason = update.reason
                    self._note_unplanned_change(f"run failed: {update.reason}")
                    return
                if self.membership is not None and not self.standby \
                        and update.membership.generation > self.membership.generation:
                    self._note_unplanned_change(update.reason or "membership changed")
        except Exception as e:  # noqa: BLE001 - the heartbeat thread still watches
            logger.warning("membership watch ended: %s", e)

    def _note_unplanned_change(self, reason: str) -> None:
        if self._reforming.is_set():
            return
        self._unplanned_change.set()
        # Peers are gone: stop waiting on them now rather than at the timeout.
        self._tell_peers_lost(f"membership changed: {reason}")

    def _tell_peers_lost(self, reason: str) -> None:
        for listener in self._peers_lost_listeners:
            listener(reason)


def _orchestrator_lost(needed_for: str, error: OrchestratorUnreachableError) -> str:
    return (f"this worker needs the orchestrator to {needed_for}, but {error.message}. Raise "
            f"{environment.ORCHESTRATOR_WAIT} (seconds, default {DEFAULT_ORCHESTRATOR_WAIT_S:g}) "
            f"to wait longer, or run replicas (tfelastic-orchestrator --store etcd://...)")
