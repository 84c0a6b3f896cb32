"""This process's place in the elastic job: its node id, its generation, and how it re-forms.

`init()` connects to the orchestrator with the settings the launcher puts in
the environment. A node that arrives while a job runs registers (gets its
permanent id) without joining yet, so it can build its model and trace its
functions while the members keep training; it joins when training starts.

Two threads keep the view current: heartbeats (liveness, nodes waiting to
join) and the orchestrator's watch stream, which unblocks this process's
collectives at once when a peer is gone.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from typing import TYPE_CHECKING

from tensorflow_elastic import events
from tensorflow_elastic.agent import ports
from tensorflow_elastic.agent.spec import parse_endpoint
from tensorflow_elastic.errors import ElasticJobFailed
from tensorflow_elastic.observability.steps import StepReporter
from tensorflow_elastic.rendezvous import Client
from tensorflow_elastic.rendezvous.auth import TOKEN_ENV
from tensorflow_elastic.rendezvous.errors import (UNKNOWN_RUN, GenerationChangedError,
                                                  RendezvousError, RunFailedError)

if TYPE_CHECKING:
    from tensorflow_elastic.strategy.strategy import ElasticMultiWorkerMirroredStrategy

logger = logging.getLogger(__name__)

ENDPOINT_ENV = "TFE_RDZV_ENDPOINT"
RUN_ID_ENV = "TFE_RUN_ID"
ADDRESS_ENV = "TFE_ADDRESS"
# A listening socket the launcher's agent passes down, holding the port of ADDRESS_ENV.
ADDRESS_FD_ENV = "TFE_ADDRESS_FD"
MIN_NODES_ENV = "TFE_MIN_NODES"
MAX_NODES_ENV = "TFE_MAX_NODES"
JOIN_TIMEOUT_ENV = "TFE_JOIN_TIMEOUT"
STEP_EVENTS_ENV = "TFE_STEP_EVENTS_EVERY"
PROGRESS_TIMEOUT_ENV = "TFE_PROGRESS_TIMEOUT"
DEFAULT_PROGRESS_TIMEOUT_S = 600.0

DEFAULT_JOIN_TIMEOUT_S = 600.0
DEFAULT_BARRIER_TIMEOUT_S = 120.0
HEARTBEAT_INTERVAL_S = 0.5

_runtime: "ElasticRuntime | None" = None
_runtime_lock = threading.Lock()


class ElasticRuntime:
    """The membership of this process and the re-form protocol it follows."""

    def __init__(self, client: Client, address: str, min_nodes: int, max_nodes: int,
                 join_timeout: float = DEFAULT_JOIN_TIMEOUT_S,
                 address_reservation: socket.socket | None = None):
        if not 1 <= min_nodes <= max_nodes:
            raise ValueError(f"need 1 <= min_nodes <= max_nodes, got {min_nodes}:{max_nodes}")
        self.client = client
        self.address = address
        self._address_reservation = address_reservation
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes
        self.join_timeout = join_timeout
        self.events = events.EventLog(source="worker")
        self._steps = StepReporter(every=int(os.environ.get(STEP_EVENTS_ENV, "10")))
        # The watchdog: no commit for this long while training aborts the
        # collectives, so a hang nobody detected still ends in an error.
        self.progress_timeout = float(os.environ.get(PROGRESS_TIMEOUT_ENV,
                                                     DEFAULT_PROGRESS_TIMEOUT_S))
        self._last_progress: float | None = None
        self.membership = None
        self.standby = False
        self.strategy: ElasticMultiWorkerMirroredStrategy | None = None
        self._waiting = 0
        self._leave_requested = threading.Event()
        self._unplanned_change = threading.Event()
        self._reforming = threading.Event()
        self._failure_reason = ""
        self._watch_thread: threading.Thread | None = None

    # ---------------------------------------------------------------- joining

    def start(self) -> None:
        """Joins the forming job, or registers as a standby node when the job already runs."""
        try:
            running = self.client.status()[0].state == "ACTIVE"
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
        from tensorflow_elastic.strategy import cluster

        cluster.configure(self.node_id)
        if threading.current_thread() is threading.main_thread():
            # A preemption notice: finish the step, commit, leave; nobody rolls back.
            signal.signal(signal.SIGTERM, lambda signum, frame: self.request_leave())
        self.client.start_heartbeats(HEARTBEAT_INTERVAL_S, self._on_heartbeat)
        self._watch_thread = threading.Thread(target=self._watch, name="tfe-watch", daemon=True)
        self._watch_thread.start()

    @property
    def node_id(self) -> int:
        return self.client.node_id

    @property
    def generation(self) -> int:
        return 0 if self.membership is None else self.membership.generation

    def initial_cluster(self) -> tuple[int, dict[int, str], int]:
        """(node id, members, generation) for the strategy's first server: a standby node is alone."""
        if self.standby:
            return self.node_id, {self.node_id: self.address}, 0
        return self.node_id, dict(self.membership.members), self.membership.generation

    def release_address(self) -> None:
        """Frees this node's port for its TensorFlow server, which binds it next."""
        if self._address_reservation is not None:
            self._address_reservation.close()
            self._address_reservation = None

    def attach_strategy(self, strategy: "ElasticMultiWorkerMirroredStrategy") -> None:
        if self.strategy is not None and self.strategy is not strategy:
            raise RuntimeError("only one ElasticMultiWorkerMirroredStrategy per process")
        self.strategy = strategy

    def _join(self) -> None:
        """Blocks until this node is a member of a generation newer than its last one."""
        try:
            self.membership = self.client.join(self.address, self.min_nodes, self.max_nodes,
                                               timeout=self.join_timeout)
        except RunFailedError as e:
            raise ElasticJobFailed(f"the elastic job cannot continue: {e.message}") from None
        self._unplanned_change.clear()
        if self.standby or self.strategy is None:
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
        finally:
            self._reforming.clear()

    def _regroup(self) -> None:
        membership = self.membership
        if self.strategy is not None:
            self.strategy.extended.regroup(membership.members, membership.generation)
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
        self.client.leave(reason)
        self.close()

    def report_step(self, step: int) -> None:
        """Notes progress for the watchdog; a `step` event every TFE_STEP_EVENTS_EVERY commits."""
        self._last_progress = time.monotonic()
        if self._steps.due(step):
            self._steps.report(step, self.membership.world_size, node=self.node_id,
                               generation=self.generation)

    def report_failure(self, error: BaseException) -> None:
        """Tells the orchestrator which peers this process cannot reach."""
        from tensorflow.python.eager import context

        peers = []
        for node_id in sorted(self.membership.members):
            if node_id == self.node_id:
                continue
            try:
                context.context().check_collective_ops_peer_health(
                    f"/job:worker/replica:0/task:{node_id}", timeout_in_ms=1000)
            except Exception:  # noqa: BLE001 - any failure to answer means unreachable
                peers.append(node_id)
        self.events.record(events.FAILURE_DETECTED, node=self.node_id, generation=self.generation,
                           failed=peers, cause=f"{type(error).__name__}: {str(error)[:200]}")
        if peers:
            try:
                self.client.report_failure(peers, reason=type(error).__name__)
            except GenerationChangedError:
                pass  # another member's report already started the next generation

    def finish(self) -> None:
        """The exit barrier (every member has returned from training), then a clean leave.

        Leaving at once keeps the orchestrator from taking finished members for
        failed ones when their heartbeats stop.
        """
        self._reforming.set()
        try:
            self.client.barrier(f"exit-{self.generation}", timeout=DEFAULT_BARRIER_TIMEOUT_S)
        except GenerationChangedError:
            # A member was lost after training: every step is done, nobody pulls buffers now.
            logger.info("generation %d ended at the exit barrier", self.generation)
        self.events.record(events.JOB_COMPLETE, node=self.node_id, generation=self.generation)
        try:
            self.client.leave("job complete")
        except RendezvousError as e:
            logger.info("leave after the job: %s", e)
        self.close()

    def close(self) -> None:
        self.client.stop_heartbeats()

    # ------------------------------------------------------------ listeners

    def _on_heartbeat(self, info) -> None:
        self._waiting = info.waiting
        if (self._last_progress is not None and not self._reforming.is_set()
                and time.monotonic() - self._last_progress > self.progress_timeout):
            self._last_progress = time.monotonic()
            from tensorflow_elastic.strategy import cluster

            cluster.abort_collectives(
                f"no commit for {self.progress_timeout:g} s ({PROGRESS_TIMEOUT_ENV}); a peer "
                f"may hang without having failed")
        if info.state == "FAILED":
            self._failure_reason = "the orchestrator ended the run"
            self._note_unplanned_change("run failed")
        elif self.membership is not None and not self.standby \
                and info.generation > self.membership.generation:
            self._note_unplanned_change(f"generation {info.generation} started")

    def _watch(self) -> None:
        try:
            for update in self.client.watch():
                self._waiting = update.waiting
                if update.state == "FAILED":
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
        from tensorflow_elastic.strategy import cluster

        # Peers are gone: stop waiting on them now rather than at the timeout.
        cluster.abort_collectives(f"membership changed: {reason}")

    def check_job_alive(self) -> None:
        if self._failure_reason:
            raise ElasticJobFailed(self._failure_reason)


def _inherited_hold(port: int) -> socket.socket | None:
    """The socket the launcher passed down holding `port` (ADDRESS_FD_ENV), if there is one."""
    fd = os.environ.pop(ADDRESS_FD_ENV, None)
    if fd is None:
        return None
    try:
        held = socket.socket(fileno=int(fd))
    except (ValueError, OSError):
        logger.warning("%s=%s is not an open socket; holding the port anew", ADDRESS_FD_ENV, fd)
        return None
    held.set_inheritable(False)  # the worker's own children must not keep the port
    if held.getsockname()[1] != port:
        held.close()
        return None
    return held


def _reserve(address: str | None) -> tuple[str, socket.socket]:
    """(address, its held port): `address`, or a free loopback one; held until the server binds.

    A port the launcher passed down held (ADDRESS_FD_ENV) stays held, with no gap.
    """
    if not address:
        reservation = ports.reserve_port("127.0.0.1")
        return ports.format_address("127.0.0.1", reservation.getsockname()[1]), reservation
    host, port = parse_endpoint(address)
    inherited = _inherited_hold(port)
    if inherited is not None:
        return address, inherited
    try:
        return address, ports.reserve_port(host, port)
    except OSError as e:
        raise ElasticJobFailed(
            f"this node's address {address} cannot be used: port {port} is taken ({e.strerror}); "
            f"give the node a free port ({ADDRESS_ENV}, init(address=...)) or leave it out to "
            f"get one") from None


def init(endpoint: str | None = None, run_id: str | None = None, token: str | None = None,
         address: str | None = None, min_nodes: int | None = None,
         max_nodes: int | None = None) -> ElasticRuntime:
    """Connects this process to its elastic job; arguments default to the launcher's environment."""
    global _runtime
    with _runtime_lock:
        if _runtime is not None:
            return _runtime
        endpoint = endpoint or os.environ.get(ENDPOINT_ENV)
        if not endpoint:
            raise ElasticJobFailed(
                f"no orchestrator endpoint: start the script with tfelastic-run, or pass "
                f"tensorflow_elastic.init(endpoint='HOST:PORT'), or set {ENDPOINT_ENV}")
        run_id = run_id or os.environ.get(RUN_ID_ENV, "default")
        token = token or os.environ.get(TOKEN_ENV) or None
        address, reservation = _reserve(address or os.environ.get(ADDRESS_ENV))
        min_nodes = min_nodes or int(os.environ.get(MIN_NODES_ENV, "1"))
        max_nodes = max_nodes or int(os.environ.get(MAX_NODES_ENV, str(max(min_nodes, 1))))
        join_timeout = float(os.environ.get(JOIN_TIMEOUT_ENV, DEFAULT_JOIN_TIMEOUT_S))
        runtime = ElasticRuntime(Client(endpoint, run_id, token), address, min_nodes, max_nodes,
                                 join_timeout, address_reservation=reservation)
        runtime.start()
        _runtime = runtime
        return runtime


def ensure_initialized(min_nodes: int | None = None, max_nodes: int | None = None) -> ElasticRuntime:
    """The runtime, initialized if needed; bounds that contradict the running job are an error."""
    if _runtime is None:
        return init(min_nodes=min_nodes, max_nodes=max_nodes)
    for name, asked, actual in (("min_nodes", min_nodes, _runtime.min_nodes),
                                ("max_nodes", max_nodes, _runtime.max_nodes)):
        if asked is not None and asked != actual:
            raise ValueError(
                f"{name}={asked} differs from the job's {name}={actual} (set by "
                f"tensorflow_elastic.init() or the launcher's --nnodes); pass the same bounds "
                f"or leave them out")
    return _runtime


def current_or_none() -> ElasticRuntime | None:
    return _runtime


def current() -> ElasticRuntime:
    if _runtime is None:
        raise ElasticJobFailed("tensorflow_elastic.init() has not been called in this process")
    return _runtime
