"""A worker's membership: its node id, its generation, its phase and the calls of the protocol.

TensorFlow-free, so the protocol is testable without a cluster. A node that
arrives while a job runs registers (gets its permanent id) without joining
yet, so it can build its model and trace its functions while the members keep
training; it joins when training starts.

The session does the membership steps; the runtime (strategy/runtime.py)
decides their order. Two threads keep the view current: heartbeats (liveness,
nodes waiting to join) and the orchestrator's watch stream. A third, the
progress watchdog, notices training that stopped committing (see
:class:`ProgressWatchdog`). When they learn that peers are gone they call the
`on_peers_lost` collaborator the session was given (it unblocks whatever waits
on a lost peer); nothing else calls out of the session.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from typing import Callable

from tensorflow_elastic import environment
from tensorflow_elastic.errors import ElasticJobFailed, GenerationEnded
from tensorflow_elastic.membership import node_file
from tensorflow_elastic.membership.phase import (LIVE, WAITING_ON_THE_ORCHESTRATOR, PhaseMachine,
                                                 WorkerPhase)
from tensorflow_elastic.membership.spare import Spare
from tensorflow_elastic.membership.watchdog import ProgressWatchdog
from tensorflow_elastic.net import Probe, probe
from tensorflow_elastic.observability import events
from tensorflow_elastic.observability.steps import StepReporter
from tensorflow_elastic.rendezvous.client import Client
from tensorflow_elastic.rendezvous.errors import (UNKNOWN_RUN, BlocklistedError,
                                                  GenerationChangedError, NodeRemovedError,
                                                  OrchestratorUnreachableError, RendezvousError,
                                                  RunFailedError)
from tensorflow_elastic.rendezvous.settings import heartbeat_interval
from tensorflow_elastic.rendezvous.types import Membership, NodeBounds, Phase

logger = logging.getLogger(__name__)

DEFAULT_JOIN_TIMEOUT_S = 600.0
# Members reach a barrier within milliseconds of each other (after a join, or at the end of the
# same step); one that has not after this long is hung, and the orchestrator removes it.
DEFAULT_BARRIER_TIMEOUT_S = 30.0
# No commit for this long while training: see ProgressWatchdog. The longest pause between two
# commits of a healthy member is one step plus a re-form and a state sync (seconds in the tests
# and benchmarks, minutes for a first step that compiles a large model); PyTorch's NCCL
# collectives time out after 10 minutes by default, which the fallback below (twice this) matches.
DEFAULT_PROGRESS_TIMEOUT_S = 300.0
# A step inside TensorFlow with no commit for this long probes the peers (see ProgressWatchdog):
# a peer that does not answer while the orchestrator reaches it is a partition, reported at once.
# The default of $TFE_PEER_CHECK_AFTER: longer than any healthy step of the tests and benchmarks.
PEER_CHECK_AFTER_S = 5.0
PEER_PROBE_TIMEOUT_S = 1.0
# How often a removed node whose address is blocked asks again to come back.
BLOCKED_RETRY_S = 2.0
# Commits rewrite the node file at most this often (the agent reads it every second).
NODE_FILE_INTERVAL_S = 1.0
# How long a worker waits for an orchestrator that does not answer (environment.ORCHESTRATOR_WAIT).
DEFAULT_ORCHESTRATOR_WAIT_S = 60.0

# on_peers_lost(reason, generation): when the loss is a membership change, `generation` is the
# first generation that has not ended (collectives of older ones must stop); None when every
# collective must stop (the run failed, this node lost its place, the watchdog fired).
PeersLost = Callable[[str, "int | None"], None]

# Where a live node may hear that the job went on without it.
_IN_THE_JOB = frozenset({WorkerPhase.MEMBER, WorkerPhase.REFORMING, WorkerPhase.STEPPED_ASIDE})


@dataclasses.dataclass(frozen=True)
class Absence:
    """Why and since when (time.monotonic(); None when it learnt of it only as it came back) the
    job may be going on without this live node: it was removed, or it stepped aside. Cleared
    when it is back."""

    reason: str
    since: float | None


class MembershipSession:
    """One node's membership of an elastic job: its phase and the protocol's membership steps."""

    def __init__(self, client: Client, address: str, bounds: NodeBounds,
                 on_peers_lost: PeersLost = lambda reason, generation: None,
                 join_timeout: float = DEFAULT_JOIN_TIMEOUT_S,
                 progress_timeout: float = DEFAULT_PROGRESS_TIMEOUT_S, step_events_every: int = 10,
                 barrier_timeout: float = DEFAULT_BARRIER_TIMEOUT_S, node_file_path: str = "",
                 spare: Spare | None = None):
        """`node_file_path`: where this node tells its agent its id and generation (none: no
        agent listens); `spare`: its agent started it ahead of need (membership/spare.py)."""
        self.client = client
        self.address = address
        self.bounds = bounds
        self.join_timeout = join_timeout
        self.barrier_timeout = barrier_timeout
        self.events = events.EventLog(source="worker")
        self._steps = StepReporter(every=step_events_every)
        self._on_peers_lost = on_peers_lost
        self._node_file_path = node_file_path
        self._spare = spare
        # What the node file tells the agent besides the membership (its metrics, progress).
        self.progress = node_file.Progress()
        self._told_agent_at = float("-inf")
        self.membership: Membership | None = None
        self.phases = PhaseMachine()
        self.absence: Absence | None = None
        # Votes and news that change nothing of the phase by themselves.
        self._waiting = 0
        self._leave_requested = threading.Event()
        self._generation_ended = threading.Event()
        # The newest active generation the watch stream delivered (its node_id is None).
        self._watched: Membership | None = None
        self._watch_thread: threading.Thread | None = None
        # Training returned here (finish()): this node's part of the job is done.
        self.finished = False
        self.watchdog = ProgressWatchdog(progress_timeout, self._step_aside, self._on_stalled,
                                         paused=lambda: self.phase in WAITING_ON_THE_ORCHESTRATOR,
                                         on_slow=self._check_peers,
                                         slow_after=environment.duration(
                                             environment.PEER_CHECK_AFTER, PEER_CHECK_AFTER_S))

    # ------------------------------------------------------------------- views

    @property
    def phase(self) -> WorkerPhase:
        return self.phases.phase

    @property
    def node_id(self) -> int:
        return self.client.node_id

    @property
    def generation(self) -> int:
        return 0 if self.membership is None else self.membership.generation

    @property
    def standby(self) -> bool:
        """Registered while the job runs: it joins when it starts to train."""
        return self.phase is WorkerPhase.STANDBY

    @property
    def leave_requested(self) -> bool:
        return self._leave_requested.is_set()

    def initial_cluster(self) -> tuple[int, dict[int, str], int]:
        """(node id, members, generation) for the first server: a standby node is alone."""
        if self.standby:
            return self.node_id, {self.node_id: self.address}, 0
        return self.node_id, dict(self.membership.members), self.membership.generation

    def wants_reform(self) -> bool:
        """This member's vote at a commit: nodes wait to join, it is leaving, or the group changed."""
        world = 0 if self.membership is None else self.membership.world_size
        return (self._leave_requested.is_set() or self._generation_ended.is_set()
                or (self._waiting > 0 and world < self.bounds.max_nodes))

    def moved_on(self) -> bool:
        """Whether the job went on without this node's generation: it was removed, or a newer
        generation started. A collective that fails then (e.g. a peer no longer knows its
        group: FailedPreconditionError) failed because of the change, not the training code."""
        if self.absence is not None or self._generation_ended.is_set():
            return True
        try:
            info = self.client.heartbeat()
        except NodeRemovedError as e:
            self._note_removed(e)
            return True
        except RendezvousError:
            return False
        return info.generation > self.generation

    def check_job_alive(self) -> None:
        if self.phase is WorkerPhase.FAILED:
            raise ElasticJobFailed(self.phases.reason)

    # ------------------------------------------------------------------- joining

    def start(self) -> None:
        """Joins the forming job, or registers as a standby node when the job already runs (a
        spare always does)."""
        try:
            running = self.client.status()[0].state == Phase.ACTIVE
        except RendezvousError as e:
            if e.reason != UNKNOWN_RUN:
                raise
            running = False
        if running or self._spare is not None:
            self.client.register(self.address, self.bounds.min_nodes, self.bounds.max_nodes)
            self.phases.node = f"node {self.node_id}"
            self.phases.move(WorkerPhase.STANDBY, "the job runs already" if running
                             else "a spare, started ahead of need")
            self.tell_agent()
            logger.info("node %d registered; joins when training starts", self.node_id)
            return
        self._join()
        self.phases.node = f"node {self.node_id}"
        self.phases.move(WorkerPhase.MEMBER, f"joined generation {self.generation}")
        self.tell_agent()

    def tell_agent(self) -> None:
        """Rewrites the node file: the agent's view of this node (membership, progress)."""
        if self._node_file_path:
            world = 0 if self.membership is None else self.membership.world_size
            node_file.write(self._node_file_path,
                            self.progress.record(self.node_id, self.generation, world,
                                                 self.finished))
            self._told_agent_at = time.monotonic()

    def start_watching(self) -> None:
        """Starts the heartbeat and watch threads."""
        self.client.start_heartbeats(heartbeat_interval(), self._on_heartbeat,
                                     self._on_heartbeats_stopped)
        self._watch_thread = threading.Thread(target=self._watch, name="tfe-watch", daemon=True)
        self._watch_thread.start()
        self.watchdog.start()

    def _join(self) -> Membership:
        """Blocks until this node is a member of a generation newer than its last one.

        A node coming back after a removal whose address is blocked (it failed repeatedly)
        waits the block out, within its join timeout.
        """
        first = self.membership is None or self.standby
        deadline = time.monotonic() + self.join_timeout
        while True:
            watched = None if first else self._watched_member_of_newer()
            if watched is not None:
                # The orchestrator formed it without this node's join (a member was lost) and
                # the watch told so: joining would only ask for what is known. Its barrier
                # tells the orchestrator that this node knows it.
                self.client.follow(watched)
                self.membership = watched
                break
            try:
                self.membership = self.client.join(self.address, self.bounds.min_nodes,
                                                   self.bounds.max_nodes,
                                                   timeout=max(1.0, deadline - time.monotonic()))
                break
            except RunFailedError as e:
                raise ElasticJobFailed(f"the elastic job cannot continue: {e.message}") from None
            except NodeRemovedError as e:
                raise ElasticJobFailed(f"this node cannot come back to the job: {e.message}") \
                    from None
            except BlocklistedError as e:
                # A member's address is blocked only once it was removed (its heartbeat may
                # not have said so yet: the generation's end reached it first).
                if (self.absence is None and first) or time.monotonic() > deadline:
                    raise
                removed = (f"node {self.node_id} was removed" if self.absence is None
                           else self.absence.reason)
                logger.warning("%s; it waits to come back: %s", removed, e.message)
                time.sleep(BLOCKED_RETRY_S)
        self._generation_ended.clear()
        if self.membership.taken_back_after and self.absence is None:
            # Its join overtook the heartbeat that would have told it of the removal.
            self.absence = Absence(self.membership.taken_back_after, None)
        if self.absence is not None:
            self._back_after_absence()
        if first:
            self.events.record(events.RENDEZVOUS_COMPLETE, node=self.node_id,
                               generation=self.membership.generation,
                               members=sorted(self.membership.members),
                               world_size=self.membership.world_size)
        return self.membership

    def _watched_member_of_newer(self) -> Membership | None:
        """The newest generation the watch delivered, when it is newer than this node's and has
        it as a member (a node that was removed and lives on joins instead: the join tells it
        why it was removed)."""
        watched = self._watched
        if (watched is None or self.membership is None or self.absence is not None
                or watched.generation <= self.membership.generation
                or self.node_id not in watched.members):
            return None
        return dataclasses.replace(watched, node_id=self.node_id)

    # ---------------------------------------------------------------- re-forming

    def begin_reform(self, why: str) -> None:
        """This node stops training in its generation to move to the next one with the others."""
        self.phases.move(WorkerPhase.REFORMING, why)

    def join_next_generation(self) -> Membership:
        """The next generation this node is a member of (blocks until the orchestrator has it).
        A spare first waits until its agent needs it."""
        if self.standby and self._spare is not None:
            self._wait_as_spare()
        self.begin_reform("joining the next generation")
        try:
            return self._join()
        except OrchestratorUnreachableError as e:
            raise ElasticJobFailed(_orchestrator_lost("re-form", e)) from None

    def _wait_as_spare(self) -> None:
        """Warmed up and ready to receive the state: waits for the agent's word. A spare that is
        not needed (its agent ended the pipe or sent SIGTERM, the job ended) did no work: it
        leaves and its process exits 0."""
        logger.warning("node %d is a spare, ready: it joins when its launcher needs it",
                       self.node_id)
        needed = self._spare.wait_until_needed(
            lambda: self.leave_requested or self.phase is not WorkerPhase.STANDBY)
        self._spare = None
        if needed:
            logger.warning("node %d (spare) joins the job", self.node_id)
            return
        if self.phase is WorkerPhase.STANDBY:
            try:
                self.leave("a spare that was not needed")
            except RendezvousError:
                pass  # the job is over: nobody needs to know
        raise SystemExit(0)

    def start_generation(self, membership: Membership,
                         message: bytes) -> dict[int, bytes] | None:
        """The new generation's barrier, which also gathers every member's `message` (the
        state sync's, so that the sync that follows needs no round trip of its own): every
        member's message by node id, or None when the membership moved on meanwhile (a
        leaver's departure landed after the others re-joined, a second failure) and the node
        must join the next one."""
        try:
            gathered = self.client.synchronize(f"generation-{membership.generation}", message,
                                               timeout=self.barrier_timeout)
        except GenerationChangedError:
            logger.info("generation %d ended while forming; joining the next one",
                        membership.generation)
            return None
        except NodeRemovedError as e:
            self._note_removed(e)
            return None
        except OrchestratorUnreachableError as e:
            raise ElasticJobFailed(_orchestrator_lost("re-form", e)) from None
        self.events.record(events.GENERATION_START, node=self.node_id,
                           generation=membership.generation, members=sorted(membership.members),
                           world_size=membership.world_size, chief=membership.chief_id)
        # News that this node was removed meanwhile keeps it REMOVED: it re-forms again.
        self.phases.move(WorkerPhase.MEMBER, f"generation {membership.generation} started",
                         only_from={WorkerPhase.REFORMING})
        self.watchdog.restart()
        self.tell_agent()
        return gathered

    def finish_step_together(self) -> None:
        """At a planned change: returns once every member has finished the step.

        TensorFlow's collectives pull their buffers from the peers, so a member
        that left (or updated its server) while a slower one was still pulling
        the step's last buffers from it would fail that step. A failure while
        members gather is left to the re-form that follows.
        """
        self.begin_reform("the members voted to re-form at this commit")
        try:
            self.client.barrier(f"change-{self.generation}", timeout=self.barrier_timeout)
        except GenerationChangedError:
            logger.info("generation %d ended while its members finished the step", self.generation)
        except NodeRemovedError as e:
            self._note_removed(e)

    def exchange(self, topic: str, value: bytes) -> dict[int, bytes]:
        """Every current member's `value` for `topic`, by node id (a small all-gather).

        Raises GenerationEnded when a member is lost while the others gather.
        """
        try:
            return self.client.synchronize(f"{topic}-{self.generation}", value)
        except GenerationChangedError as e:
            raise GenerationEnded(str(e)) from None
        except NodeRemovedError as e:
            self._note_removed(e)
            raise GenerationEnded(str(e)) from None

    def request_leave(self) -> None:
        """Asks to leave at the next commit (e.g. on SIGTERM, a preemption notice)."""
        self._leave_requested.set()

    def leave(self, reason: str) -> None:
        self.phases.move(WorkerPhase.LEAVING, reason, only_from=LIVE)
        self.events.record(events.NODE_LEFT, node=self.node_id, generation=self.generation,
                           reason=reason)
        self.close()  # first: a heartbeat after the leave would find the node gone
        self.client.leave(reason)
        self.phases.move(WorkerPhase.FINISHED, reason, only_from={WorkerPhase.LEAVING})

    def report_step(self, step: int) -> None:
        """Notes progress for the watchdog; a `step` event every `step_events_every` commits."""
        self.watchdog.progress()
        if self.phase is WorkerPhase.STEPPED_ASIDE:
            self._recovered_in_place()
        if self._steps.due(step):
            self._steps.report(step, self.membership.world_size, node=self.node_id,
                               generation=self.generation)
        self.progress.step = step
        if time.monotonic() - self._told_agent_at >= NODE_FILE_INTERVAL_S:
            self.tell_agent()

    def report_failure(self, peers: list[int], reason: str, detail: str) -> None:
        """Records the failure and tells the orchestrator which peers this node cannot reach."""
        self.events.record(events.FAILURE_DETECTED, node=self.node_id, generation=self.generation,
                           failed=peers, cause=f"{reason}: {detail[:200]}")
        if peers:
            try:
                self.client.report_failure(peers, reason=reason)
            except GenerationChangedError:
                pass  # another member's report already started the next generation
            except NodeRemovedError as e:
                self._note_removed(e)  # the others went on without this node
            except OrchestratorUnreachableError as e:
                raise ElasticJobFailed(_orchestrator_lost("re-form", e)) from None

    def finish(self, step: int) -> None:
        """The exit barrier (every member has returned from training at `step`), then a clean leave.

        Leaving at once keeps the orchestrator from taking finished members for
        failed ones when their heartbeats stop. Training is over either way: when
        the orchestrator cannot be reached, it returns with a warning, so that the
        code after training (saving the model) runs.
        """
        # Training is over even when the job failed meanwhile: the code after it still runs.
        self.phases.move(WorkerPhase.LEAVING, f"training finished at step {step}",
                         only_from=LIVE)
        reachable = True
        try:
            self.client.barrier(f"exit-{self.generation}", timeout=self.barrier_timeout)
        except (GenerationChangedError, NodeRemovedError):
            # A member was lost after training: every step is done, nobody pulls buffers now.
            logger.info("generation %d ended at the exit barrier", self.generation)
        except OrchestratorUnreachableError as e:
            reachable = False
            logger.warning("training finished at step %d, but %s; returning without the exit "
                           "barrier and the leave", step, e.message)
        self.events.record(events.JOB_COMPLETE, node=self.node_id, generation=self.generation,
                           step=step)
        self.finished = True
        self.tell_agent()
        self.close()  # first: a heartbeat after the leave would find the node gone
        self.phases.move(WorkerPhase.FINISHED, "job complete", only_from={WorkerPhase.LEAVING})
        if not reachable:
            return
        try:
            self.client.leave("job complete", job_finished=True)
        except RendezvousError as e:
            logger.info("leave after the job: %s", e)

    def close(self) -> None:
        self.watchdog.stop()
        self.client.stop_heartbeats()

    # ------------------------------------------------------------ background news

    def _fail(self, reason: str) -> None:
        """The job cannot go on here: the next commit or re-form raises `reason`. A node
        already leaving (training is over) leaves as it would have."""
        self.phases.move(WorkerPhase.FAILED, reason, only_from=LIVE - {WorkerPhase.LEAVING})

    def _on_heartbeat(self, info) -> None:
        self._waiting = info.waiting
        if info.state == Phase.FAILED:
            self._note_generation_ended("run failed", None)
            self._fail("the orchestrator ended the run")
        elif self._has_ended(info.generation, info.state):
            self._note_generation_ended(f"generation {info.generation} started",
                                        _live_from(info.generation, info.state))

    def _on_heartbeats_stopped(self, error: Exception) -> None:
        """This node can no longer prove it is alive (the run failed, a bug): training here
        must end with that reason, not hang on peers that moved on. Removed while alive, it
        stops waiting on its old peers and comes back at its next re-form instead."""
        if isinstance(error, NodeRemovedError) and error.may_return:
            self._note_removed(error)
            return
        reason = getattr(error, "message", None) or str(error)
        logger.error("heartbeats to the orchestrator stopped: %s", reason)
        self._fail(f"this node lost its place in the job: {reason}")
        self._on_peers_lost(f"heartbeats stopped: {reason}", None)

    def _note_removed(self, error: NodeRemovedError) -> None:
        """The orchestrator removed this node while its process lived on: its peers went on
        without it. What waits on them is aborted; the next re-form takes the node back (or,
        when it may not come back, the job fails here with the reason)."""
        if not error.may_return:
            self._on_heartbeats_stopped(error)
            return
        if self.absence is not None:
            return  # it knows already (or stepped aside: see _recovered_in_place)
        # "node N was removed from run R (cause)", without the advice that follows.
        reason = error.message.split("; ")[0]
        # The absence first: whoever sees the phase sees why. A standby node stays one: it
        # comes back when it joins.
        self.absence = Absence(reason, time.monotonic())
        if self.phase is not WorkerPhase.STANDBY and not self.phases.move(
                WorkerPhase.REMOVED, reason, only_from=_IN_THE_JOB):
            self.absence = None
            return
        logger.warning("%s while its process lived on; it rejoins at its next re-form", reason)
        self.events.record(events.NODE_LEFT, node=self.node_id, generation=self.generation,
                           reason=f"removed: {reason}")
        self._generation_ended.set()
        self._on_peers_lost(f"this node was removed: {reason}", None)

    def _back_after_absence(self) -> None:
        """Taken back after a removal: heartbeats again, and says so once."""
        absence, self.absence = self.absence, None
        # News of the removal that came while it joined: the join took it back.
        self.phases.move(WorkerPhase.REFORMING, "taken back", only_from={WorkerPhase.REMOVED})
        later = "" if absence.since is None else f", {time.monotonic() - absence.since:.1f} s later"
        logger.warning("%s and rejoined at generation %d%s", absence.reason, self.generation, later)
        self.events.record(events.NODE_JOINED, node=self.node_id, generation=self.generation,
                           rejoined=True, removed_for=absence.reason)
        self._resume_heartbeats()

    def _resume_heartbeats(self) -> None:
        self.client.start_heartbeats(heartbeat_interval(), self._on_heartbeat,
                                     self._on_heartbeats_stopped)

    def _step_aside(self, reason: str) -> None:
        """The watchdog found this node stuck outside TensorFlow while its peers wait for it.

        It stops heartbeating, so the orchestrator removes it at the heartbeat timeout and the
        others go on without it. It aborts nothing itself: its peers pull buffers from it, and
        an abort here would fail their step while it still counts as a member. If it recovers,
        its next collective fails (the watch stream aborted it when the others moved on) and it
        comes back at the re-form that follows.
        """
        cause = reason.splitlines()[0].split(";")[0]
        if self.phase is not WorkerPhase.MEMBER:
            return
        # The absence first: whoever sees the phase sees why.
        self.absence = Absence(f"node {self.node_id} stepped aside after {cause}",
                               time.monotonic())
        if not self.phases.move(WorkerPhase.STEPPED_ASIDE, self.absence.reason,
                                only_from={WorkerPhase.MEMBER}):
            self.absence = None
            return
        logger.error("node %d: %s (%s); it stops heartbeating so that the others go on "
                     "without it, and comes back if it recovers", self.node_id, reason,
                     environment.PROGRESS_TIMEOUT)
        self.events.record(events.FAILURE_DETECTED, node=self.node_id, generation=self.generation,
                           failed=[self.node_id], cause=f"stuck: {cause}")
        self.client.stop_heartbeats()

    def _recovered_in_place(self) -> None:
        """A node that stepped aside commits again: if nobody went on without it yet, it
        heartbeats again; if it was removed meanwhile, it comes back at its next re-form."""
        absence = self.absence
        if absence is None:
            return  # it is stepping aside this very moment: asked again at the next commit
        try:
            self.client.heartbeat()
        except NodeRemovedError:
            # The re-form takes it back and heartbeats again.
            self.phases.move(WorkerPhase.REMOVED, absence.reason,
                             only_from={WorkerPhase.STEPPED_ASIDE})
            return
        except RendezvousError:
            return  # asked again at the next commit
        self.absence = None
        logger.warning("%s and recovered %.1f s later, still a member; heartbeats again",
                       absence.reason, time.monotonic() - absence.since)
        self.phases.move(WorkerPhase.MEMBER, "recovered in place",
                         only_from={WorkerPhase.STEPPED_ASIDE})
        self._resume_heartbeats()

    def _check_peers(self, reason: str) -> None:
        """A slow step: reports the peers this node cannot reach (the orchestrator decides who
        leaves when it reaches them itself: a partition). Plain TCP probes of their servers,
        which leave the heartbeat thread free (a silent reporter would look dead itself)."""
        membership = self.membership
        if membership is None or self.phase is not WorkerPhase.MEMBER:
            return
        others = {peer: address for peer, address in membership.members.items()
                  if peer != self.node_id}
        peers = asyncio.run(_unreachable(others, PEER_PROBE_TIMEOUT_S))
        if peers:
            logger.warning("node %d: %s and peer(s) %s do not answer; reporting them",
                           self.node_id, reason, peers)
            self.report_failure(peers, "PeerUnreachable", reason)

    def _on_stalled(self, reason: str) -> None:
        logger.warning("node %d: %s (%s); aborting its collectives to re-form", self.node_id,
                       reason, environment.PROGRESS_TIMEOUT)
        self._on_peers_lost(reason, None)

    def _watch(self) -> None:
        try:
            for update in self.client.watch():
                self._waiting = update.waiting
                if update.state == Phase.FAILED:
                    self._note_generation_ended(f"run failed: {update.reason}", None)
                    self._fail(update.reason)
                    return
                if self._has_ended(update.membership.generation, update.state):
                    try:
                        self._note_generation_ended(update.reason or "membership changed",
                                                    _live_from(update.membership.generation,
                                                               update.state))
                    except Exception:  # noqa: BLE001 - a bug here must not end the watch
                        logger.exception("the change to generation %d was not acted on; "
                                         "watching on", update.membership.generation)
                if update.state == Phase.ACTIVE:
                    # Only now: a node that moves to it has had its old generation's end noted
                    # (noted after the move, it would end the new one).
                    self._watched = update.membership
        except Exception as e:  # noqa: BLE001 - the heartbeat thread still watches
            logger.warning("membership watch ended: %s", e)

    def _has_ended(self, generation: int, state: Phase) -> bool:
        """Whether the orchestrator ended this member's generation: a newer one started, or the
        run fell below min_nodes (FORMING), which leaves the number as it was."""
        if self.membership is None or self.standby:
            return False
        return generation > self.membership.generation or state == Phase.FORMING

    def _note_generation_ended(self, reason: str, generation: int | None) -> None:
        """The orchestrator ended every generation below `generation` (None: the run failed).

        While this node re-forms it votes for nothing more (it is joining the
        newest generation already), but its collectives still stop: a member
        lost after this node's barrier leaves the sync's collective waiting.
        """
        if self.phase in (WorkerPhase.LEAVING, WorkerPhase.FINISHED):
            # Its training is over: no collective of its waits, and an abort now would run
            # beside its exit (its runtime torn down under the abort).
            return
        if self.phase in (WorkerPhase.MEMBER, WorkerPhase.STEPPED_ASIDE, WorkerPhase.REMOVED):
            self._generation_ended.set()
        # Peers are gone: stop waiting on them now rather than at the timeout.
        self._on_peers_lost(f"membership changed: {reason}", generation)


def _live_from(generation: int, state: Phase) -> int:
    """The first generation that has not ended: below min_nodes (FORMING) the orchestrator keeps
    the number of the generation it ended."""
    return generation + 1 if state == Phase.FORMING else generation


def _orchestrator_lost(needed_for: str, error: OrchestratorUnreachableError) -> str:
    return (f"this worker needs the orchestrator to {needed_for}, but {error.message}. Raise "
            f"{environment.ORCHESTRATOR_WAIT} (seconds, default {DEFAULT_ORCHESTRATOR_WAIT_S:g}) "
            f"to wait longer, or run replicas (tfelastic-orchestrator --store etcd://...)")


async def _unreachable(peers: dict[int, str], timeout: float) -> list[int]:
    """The peers (id -> address) whose address refuses or ignores a connection, probed at once."""
    verdicts = await asyncio.gather(*(probe(address, timeout) for address in peers.values()))
    return [peer for peer, verdict in zip(peers, verdicts) if verdict is Probe.DEAD]
