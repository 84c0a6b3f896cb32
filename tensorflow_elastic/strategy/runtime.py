"""The process's elastic runtime: the one owner of the re-form protocol, one per process.

`init()` connects to the orchestrator with the settings the launcher puts in
the environment, prepares TensorFlow's collectives for this node's permanent
id and holds the node's port until its TensorFlow server binds it.

The runtime decides the order of every membership change and calls down, never
back up: into the membership session (join, barriers, reports), the strategy
(move TensorFlow to the new generation) and the training state (restore, sync,
reset callbacks). A State reaches the job only through the few calls of
`training.state.Job`, which the runtime implements and hands it.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable, TypeVar

from tensorflow.python.distribute import distribute_lib

from tensorflow_elastic import death_notice as death_notice_lib
from tensorflow_elastic import environment, memory, net
from tensorflow_elastic.errors import (ElasticJobFailed, GenerationEnded, MembershipChanged,
                                       StateLayoutMismatch)
from tensorflow_elastic.membership.session import (DEFAULT_BARRIER_TIMEOUT_S,
                                                   DEFAULT_JOIN_TIMEOUT_S,
                                                   DEFAULT_ORCHESTRATOR_WAIT_S,
                                                   DEFAULT_PROGRESS_TIMEOUT_S, MembershipSession)
from tensorflow_elastic.membership.spare import Spare
from tensorflow_elastic.observability import events
from tensorflow_elastic.rendezvous import Client, JobCompleteError, Membership
from tensorflow_elastic.rendezvous.types import NodeBounds
from tensorflow_elastic.strategy import cluster
from tensorflow_elastic.strategy.decision import Action, Situation, decide
from tensorflow_elastic.strategy.function_errors import pass_recoverable_errors_at_once
from tensorflow_elastic.strategy.interrupts import CollectiveInterrupter
from tensorflow_elastic.strategy.ordering import StepOrder

logger = logging.getLogger(__name__)

DEFAULT_EXIT_TIMEOUT_S = 30.0
# After the exit deadline: seconds more before faulthandler (a hang that holds the GIL), then
# SIGALRM (a hang in native code after the interpreter is gone), end the process.
EXIT_BACKUP_S = 5
# Re-forms in a row without a single commit in between: something is wrong
# beyond a lost peer (e.g. a bug that always fails the first step).
MAX_REFORMS_WITHOUT_PROGRESS = 5

T = TypeVar("T")

_runtime: "ElasticRuntime | None" = None
_runtime_lock = threading.Lock()


class StepRestarts(Exception):
    """Raised by a step after `ElasticRuntime.recover_in_step` when it cannot go on from where
    it recovered: the loop calls the step again, with the job already re-formed and synced."""


@dataclasses.dataclass
class _Change:
    """A membership change in progress, for the one line the new chief prints when it is over."""

    started: float
    members: frozenset[int]
    cause: str = ""
    lost_steps: int | None = None

    def after_failure(self, cause: str, lost_steps: int) -> "_Change":
        """This change, now also after a failure (it keeps its start and its members)."""
        return _Change(self.started, self.members, cause, (self.lost_steps or 0) + lost_steps)

    def describe(self, membership: Membership) -> str:
        now = frozenset(membership.members)
        parts = []
        if self.members - now:
            parts.append(f"node(s) {sorted(self.members - now)} "
                         + (f"lost ({self.cause})" if self.cause else "left"))
        if now - self.members:
            parts.append(f"node(s) {sorted(now - self.members)} joined")
        what = ", ".join(parts) or (f"re-formed after {self.cause}" if self.cause else "re-formed")
        took = f"recovered in {time.monotonic() - self.started:.2f} s" if self.cause \
            else f"paused {time.monotonic() - self.started:.2f} s"
        lost = "" if self.lost_steps is None else f", {self.lost_steps} step(s) lost"
        return (f"generation {membership.generation}: {what}; {membership.world_size} member(s); "
                f"{took}{lost}")


class ElasticRuntime:
    """This process's session, its held port, its strategy, and the re-form protocol."""

    def __init__(self, session: MembershipSession, interrupts: CollectiveInterrupter,
                 address_reservation: socket.socket | None = None,
                 exit_timeout: float = DEFAULT_EXIT_TIMEOUT_S,
                 death_notice: death_notice_lib.Holder | None = None):
        self.session = session
        self._exit_timeout = exit_timeout
        # Held by the main thread from start() to the interpreter's exit: a death that skips
        # the exit (a signal, a crash) reaches the agent before the process can be reaped.
        self._death_notice = death_notice
        self._interrupts = interrupts
        self._address_reservation = address_reservation
        self.strategy: distribute_lib.Strategy | None = None
        # The change under way, from its first cause to the sync that ends it.
        self._change: _Change | None = None
        # The training loop's: whether it runs, whether this node joined a running job, the
        # commits when the current sync or step began, re-forms since the last commit, and the
        # error a recovery inside the step ended with (decided there: the loop raises it as it is).
        self.training = False
        self._newcomer = False
        self._commits_before = 0
        self._reforms_without_progress = 0
        self._decided: BaseException | None = None
        self._decided_cause: BaseException | None = None
        # Whether this node recovers inside its step, and the members that did not at the last
        # sync (they begin their step next; the members tell each other with the state:
        # sync_facts).
        self._recovering_in_step = False
        self._beginning_step: frozenset[int] = frozenset()
        # (generation, every member's state-sync message) gathered at its barrier, until the
        # generation's first sync takes it.
        self._gathered_at_start: tuple[int, dict[int, bytes]] | None = None
        # Whether a joining node joins at its `fit` call's start rather than before its step
        # (join_at_fit_start), and the state it then syncs, until it joined.
        self._joins_at_fit_start = False
        self._pending_join: Any = None

    def start(self) -> None:
        """Joins (or registers), configures TensorFlow for this node, then follows the membership.

        A node that comes after the job completed has nothing to do: it says so and the
        process exits successfully (training is not started again for it).
        """
        if self._death_notice is not None and \
                threading.current_thread() is threading.main_thread():
            self._death_notice.hold()
        try:
            self.session.start()
        except JobCompleteError as e:
            self._exit_job_complete(e)
        except BaseException:
            if self._death_notice is not None:
                self._death_notice.release()  # an exception through Python is no death
            raise
        cluster.configure(self.session.node_id)
        if threading.current_thread() is threading.main_thread():
            # A preemption notice: finish the step, commit, leave; nobody rolls back.
            signal.signal(signal.SIGTERM, lambda signum, frame: self.session.request_leave())
        self.session.start_watching()
        # Called before the interpreter joins the program's non-daemon threads (atexit handlers
        # run after that join): a thread that never ends is then under the deadline too.
        threading._register_atexit(self._exit)  # noqa: SLF001 - no public hook runs that early

    def _exit_job_complete(self, error: JobCompleteError) -> None:
        """Nothing is left to train for this node: it says so and the process exits 0."""
        if self._death_notice is not None:
            self._death_notice.release()
        self.session.client.close()
        logger.warning("%s; this node exits", error.message)
        raise SystemExit(0) from None

    def _exit(self) -> None:
        """At interpreter exit, after success or a fatal error alike: stops this node's threads
        and channels (a gRPC call left open in a daemon thread can hold the exit forever), under
        a deadline that ends the process if anything else holds it; a node that finished its
        training exits successfully even then."""
        if self._death_notice is not None:
            self._death_notice.release()
        bound_exit(self._exit_timeout, finished=self.session.finished)
        self.session.client.close()
        self.session.close()

    # ------------------------------------------------------------ the protocol

    def train(self, state, step: Callable[[], T]) -> T:
        """`tfe.run`'s loop: sync, run `step()`, and on a fault go back to the last commit,
        re-form, sync and retry, until `step()` returns.

        Only the sync and the step are inside the `try`: what goes wrong while the runtime
        recovers is not a fault of the training, and ends the job with its own error. A step
        may also recover inside itself and go on (`recover_in_step`, Keras `fit`).
        """
        self._newcomer = self.session.standby
        self._begin_training(state)
        self._reforms_without_progress = 0
        self.training = True
        try:
            if self._pending_join is None:
                self._sync_until_it_holds(state)
            while True:
                self._commits_before = state.commits
                try:
                    result = step()
                except StepRestarts:
                    continue  # recovered and synced inside the step, which starts again
                except Exception as error:  # noqa: BLE001 - decide() sorts it
                    if error is self._decided:
                        # Decided inside the step, or broke its recovery there: as it was
                        # raised there (Keras' `fit` drops the cause it chained).
                        raise error from self._decided_cause
                    if self._pending_join is not None:
                        raise  # raised before this node joined: no fault of the job's
                    self._recover_step(state, error)
                else:
                    self._refuse_pending_join("returned")
                    self.session.finish(state.commits)
                    return result
        finally:
            self.training = False
            self._decided = self._decided_cause = None
            self._pending_join = None

    def recover_in_step(self, state, error: Exception) -> frozenset[int]:
        """Inside `train`'s step: recovers from `error`, which ended the step's latest piece of
        work (a Keras batch) or was raised at its commit (a change the members voted for), as
        the loop would (go back to the last commit or finish the step together, re-form, sync).
        Returns the members that did not recover inside their step (newcomers, members whose
        failure struck outside it; the sync told them all): they begin their step now. The
        step goes on in place, every member in its step alike, or raises `StepRestarts`, as
        every member then does. Raises what the loop would raise (the loop raises it again as
        it is)."""
        self._recovering_in_step, self._beginning_step = True, frozenset()
        try:
            self._recover_step(state, error)
        except BaseException as decided:
            self._note_decided(decided)
            raise
        finally:
            self._recovering_in_step = False
        return self._beginning_step

    def join_at_fit_start(self) -> None:
        """A joining node that trains with Keras `fit` and warmed it up joins at its `fit` call's
        start (the elastic callback's on_train_begin, `join_in_step`) instead of before its
        step: the members then wait for neither its input's distribution nor the rest of
        `fit`'s start."""
        self._joins_at_fit_start = True

    def join_in_step(self) -> None:
        """Inside `train`'s step: joins the job and takes the members' state, when this node's
        join waits for its step (join_at_fit_start); otherwise does nothing. What goes wrong
        is raised as the loop would raise it."""
        state, self._pending_join = self._pending_join, None
        if state is None:
            return
        try:
            self._move_to_next_generation(state)
            self._sync_until_it_holds(state)
        except BaseException as decided:
            self._note_decided(decided)
            raise
        # The step goes on from the synced state: a failure in it counts from there.
        self._commits_before = state.commits

    def _note_decided(self, decided: BaseException) -> None:
        """The error a recovery or join inside the step ended with, and its cause: the loop
        raises it as it is."""
        self._decided, self._decided_cause = decided, decided.__cause__

    def _refuse_pending_join(self, what: str) -> None:
        if self._pending_join is not None:
            raise ElasticJobFailed(
                f"the step {what} before this node joined the job: a node that warmed up with "
                f"tfe.keras.warm_up joins at the start of its `fit` call, in the ElasticCallback; "
                f"train it with `fit` and that callback (or tfe.keras.fit_elastic)")

    def _recover_step(self, state, error: Exception) -> None:
        self._recover(state, error, in_step=True)
        self._sync_until_it_holds(state)

    def _sync_until_it_holds(self, state) -> None:
        """The state sync, and after a sync that fails, a re-form and a sync again."""
        while True:
            self._commits_before = state.commits
            try:
                self.sync(state)
                return
            except Exception as error:  # noqa: BLE001 - decide() sorts it
                self._recover(state, error, in_step=False)

    def _recover(self, state, error: BaseException, in_step: bool) -> None:
        """What the loop does about an error that ended a sync or a step: raises it, or leaves,
        or re-forms (after going back to the last commit when the step was lost)."""
        commits_before = self._commits_before
        action = decide(error, Situation(in_step, self._newcomer, commits_before),
                        self.session.moved_on)
        if action is Action.RAISE:
            raise error
        if action is Action.LEAVE:
            self._leave_mismatched(error)
        if action is Action.CHANGE:
            self._finish_step_together()
        elif action is Action.RESYNC:
            logger.info("generation %d ended during the state sync; re-forming",
                        self.generation)
            self._note_change("a member lost during the state sync", 0)
        else:
            self._go_back(state, error, in_step)
        if state.commits != commits_before:
            self._reforms_without_progress = 0
        else:
            self._reforms_without_progress += 1
            if self._reforms_without_progress > MAX_REFORMS_WITHOUT_PROGRESS:
                raise ElasticJobFailed(
                    f"{self._reforms_without_progress} re-forms in a row without a single "
                    f"commit; giving up (see the events file for the failures)") from error
        self._reform(state)

    def _begin_training(self, state) -> None:
        """Before the first step: a node joining a running job prepares to receive the state,
        then joins (the sync that follows gives it the members' state), or leaves the join to
        its step (join_at_fit_start); a member prepares the syncs of its state (tracing either
        side of one in a recovery would hold it)."""
        state.bind(self)
        if self.session.standby:
            state.prepare_to_join()
            if self._joins_at_fit_start:
                self._pending_join = state
            else:
                self._move_to_next_generation(state)
        else:
            state.prepare_syncs()

    def commit(self, state) -> None:
        """A step boundary: the state's snapshot (by its commit policy), the progress, and the
        vote; raises MembershipChanged on every member at the same commit when any voted."""
        self._refuse_pending_join("committed")
        self.session.check_job_alive()
        vote = self._extended().vote
        tally = state.count_commit(vote.read_tally)
        self.session.report_step(state.commits)
        if vote.outcome(tally):
            raise MembershipChanged("membership changes at this commit")

    def _go_back(self, state, error: BaseException, in_step: bool) -> None:
        """After a failed step or sync: report who is unreachable and go back to the last
        commit (the steps since it, and the one in flight, are lost)."""
        self.session.check_job_alive()
        logger.info("collective failed (%s); re-forming", type(error).__name__)
        lost_steps = state.uncommitted_steps() + 1 if in_step else 0
        self._note_change(type(error).__name__, lost_steps)
        self.report_failure(error)
        state.restore()
        self.session.events.record(events.STATE_RESTORED, node=self.node_id,
                                   generation=self.generation, step=state.commits,
                                   lost_steps=lost_steps)

    def _finish_step_together(self) -> None:
        """The members voted at this commit (a node waits to join, one leaves): all finish the
        step together, then a leaver leaves (its process exits 0)."""
        self._change = _Change(time.monotonic(), frozenset(self.membership.members))
        self.session.finish_step_together()
        if self.session.leave_requested:
            self.session.leave("leave requested")
            raise SystemExit(0)

    def _leave_mismatched(self, error: BaseException) -> None:
        """This node's state does not fit the members': it leaves so that they re-form
        without it, and raises why."""
        if isinstance(error, StateLayoutMismatch):
            self.session.leave(f"state layout differs: {error}")
            raise error
        # The orchestrator keeps short reasons; the error itself, chained, says it all.
        first_line = (str(error).splitlines() or [type(error).__name__])[0]
        self.session.leave(f"state sync failed: {first_line[:200]}")
        raise StateLayoutMismatch(
            f"this node's state could not be synced from the members' ({first_line[:500]}): "
            f"build the same model, optimizer and inputs on every node before training") \
            from error

    def _reform(self, state) -> None:
        """The next generation with the members still there, and the state's reset callbacks
        (e.g. a learning rate that follows the world size)."""
        self._move_to_next_generation(state, reset=True)

    def _move_to_next_generation(self, state, reset: bool = False) -> None:
        """Joins the next generation, moves TensorFlow to it (and with `reset`, runs the
        state's reset callbacks), then passes the generation's barrier, which gathers the
        members' messages for the state sync that follows (one round trip for both). The
        membership may move on while members gather (a leaver's departure lands after the
        others re-joined, a second failure): then the barrier fails and the node follows to
        the newer generation."""
        while True:
            try:
                membership = self.session.join_next_generation()
            except JobCompleteError as e:
                # A newcomer formed with members that were past training when one was lost.
                self._exit_job_complete(e)
            with self._interrupts.moving_to(membership.generation):
                self.strategy.extended.regroup(membership.members, membership.generation)
            if reset:
                state.on_reset()
            gathered = self.session.start_generation(membership, state.sync_message())
            if gathered is not None:
                self._gathered_at_start = (membership.generation, gathered)
                return

    def sync(self, state) -> None:
        """Every member takes the state of the member furthest ahead; the new chief then says
        in one line what changed (TensorFlow's own lines about the aborted collectives stay in
        the workers' log files). Members tell each other how many replicas they drive with
        their state (sync_facts): the generation's collectives are sized by it."""
        state.sync()
        if self._interrupts.has_ended(self.generation):
            # The generation ended once the sync's collectives had completed: the step would
            # run up to its first collective only to find it aborted.
            raise GenerationEnded(f"generation {self.generation} ended during the state sync")
        if self._change is not None:
            if self._change.cause:
                self.session.progress.recovered(time.monotonic() - self._change.started,
                                                self._change.lost_steps or 0)
            self.session.tell_agent()
            if self.membership.is_chief:
                logger.warning("%s", self._change.describe(self.membership))
        self._change = None

    def _note_change(self, cause: str, lost_steps: int) -> None:
        if self._change is None:
            self._change = _Change(time.monotonic(), frozenset(self.membership.members))
        self._change = self._change.after_failure(cause, lost_steps)

    def report_failure(self, error: BaseException) -> None:
        """Tells the orchestrator which peers this process cannot reach after `error`.

        When the orchestrator has already started a newer generation it knows
        who was lost: the report is only recorded, with no probe of the peers
        (a frozen peer would hold it for the whole probe timeout).
        """
        membership = self.session.membership
        if self._interrupts.has_ended(membership.generation):
            peers = []
        else:
            peers = cluster.unreachable_peers(membership.members, self.session.node_id)
        self.session.report_failure(peers, type(error).__name__, str(error))

    # ------------------------------------------- what a State reaches (training.state.Job)

    def exchange(self, topic: str, value: bytes) -> dict[int, bytes]:
        return self.session.exchange(topic, value)

    def gathered_at_start(self) -> dict[int, bytes] | None:
        """Every member's state-sync message, gathered at this generation's barrier; given
        once, to the generation's first sync (None: the sync exchanges its own)."""
        gathered, self._gathered_at_start = self._gathered_at_start, None
        if gathered is None or gathered[0] != self.generation:
            return None
        return gathered[1]

    def broadcast_variables(self, variables: list, source: int, receivers: list[int],
                            one_group: bool) -> None:
        self._extended().broadcast_variables(variables, source, receivers, one_group=one_group)

    def prepare_to_sync(self, variables: list) -> None:
        self._extended().prepare_to_sync(variables)

    def record(self, event: str, **fields: Any) -> None:
        if event == events.STATE_SYNCED:
            self.session.progress.sync_bytes += fields.get("bytes", 0)
        self.session.events.record(event, node=self.node_id, generation=self.generation,
                                   **fields)

    def snapshot_extras(self) -> tuple[Any, list]:
        """(the vote's tally, the elastic inputs' cursors): what every snapshot also holds
        (None and none before there is a strategy)."""
        if self.strategy is None:
            return None, []
        extended = self.strategy.extended
        return extended.vote.tally, list(extended.input_cursors)

    def step_order(self) -> StepOrder | None:
        """The strategy's order of the steps' writes (None before there is a strategy)."""
        return None if self.strategy is None else self.strategy.extended.step_order

    def sync_facts(self) -> dict[str, Any]:
        """How many replicas this worker drives, and whether it recovers inside its step, told
        to every member at each sync (none before there is a strategy)."""
        if self.strategy is None:
            return {}
        return {"replicas": self.strategy.extended.local_replica_count,
                "in_step": self._recovering_in_step}

    def take_sync_facts(self, facts: dict[int, dict[str, Any]]) -> None:
        """Sizes the generation's collectives by every member's replica count, before its first
        collective (the sync's broadcast), and notes the members that do not recover inside
        their step."""
        self._beginning_step = frozenset(node for node, told in facts.items()
                                         if not told.get("in_step", False))
        if self.strategy is not None:
            self.strategy.extended.take_replica_counts(
                {node: told.get("replicas") for node, told in facts.items()})

    def _extended(self):
        if self.strategy is None:
            raise RuntimeError("create the ElasticMultiWorkerMirroredStrategy before training")
        return self.strategy.extended

    # ------------------------------------------------- what scripts read from init()

    @property
    def node_id(self) -> int:
        return self.session.node_id

    @property
    def generation(self) -> int:
        return self.session.generation

    @property
    def membership(self) -> Membership | None:
        """The current generation: its members, world size and this node's rank."""
        return self.session.membership

    def release_address(self) -> None:
        """Frees this node's port for its TensorFlow server, which binds it next."""
        if self._address_reservation is not None:
            self._address_reservation.close()
            self._address_reservation = None

    def attach_strategy(self, strategy: distribute_lib.Strategy) -> None:
        """Makes `strategy` (an ElasticMultiWorkerMirroredStrategy) the one this runtime moves."""
        if self.strategy is strategy:
            return
        if self.strategy is not None:
            raise RuntimeError("only one ElasticMultiWorkerMirroredStrategy per process")
        self.strategy = strategy
        self._interrupts.serve(strategy.extended.generation)


def bound_exit(timeout: float, finished: bool = False) -> None:
    """Ends the process (after writing every thread's stack to stderr) unless it has ended
    within `timeout` seconds: with exit code 0 when this node `finished` its training (its part
    of the job is done, whatever holds its exit), else 1. Backups a few seconds later end a
    hang that keeps the deadline's thread from running (exit code 1, or SIGALRM); the agent
    counts a finished node finished whatever its exit code (membership/node_file.py)."""
    code = 0 if finished else 1

    def end_the_process() -> None:
        time.sleep(timeout)
        sys.stderr.write(f"the process did not exit within {timeout:g} s "
                         f"(${environment.EXIT_TIMEOUT}); ending it with exit code {code}\n")
        faulthandler.dump_traceback(all_threads=True)
        os._exit(code)

    threading.Thread(target=end_the_process, name="tfe-exit-deadline", daemon=True).start()
    faulthandler.dump_traceback_later(timeout + EXIT_BACKUP_S, exit=True)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(int(timeout) + 2 * EXIT_BACKUP_S)


def _reserve(address: str | None) -> tuple[str, socket.socket]:
    """(address, its held port): `address`, or a free loopback one; held until the server binds.

    A port the launcher passed down held (environment.ADDRESS_FD) stays held, with no gap.
    """
    if not address:
        reservation = net.hold_port("127.0.0.1")
        return net.format_address("127.0.0.1", reservation.getsockname()[1]), reservation
    try:
        host, port = net.parse_address(address)
    except net.AddressError as e:
        raise ElasticJobFailed(f"this node's address is not usable: {e}") from None
    fd = environment.pop(environment.ADDRESS_FD)
    inherited = net.inherit_held_port(fd, port)
    if fd is not None and inherited is None:
        logger.info("%s=%s does not hold port %d; holding the port anew",
                    environment.ADDRESS_FD, fd, port)
    if inherited is not None:
        return address, inherited
    try:
        return address, net.hold_port(host, port)
    except OSError as e:
        raise ElasticJobFailed(
            f"this node's address {address} cannot be used: port {port} is taken ({e.strerror}); "
            f"give the node a free port ({environment.ADDRESS}, init(address=...)) or leave it out "
            f"to get one") from None


def _show_own_messages() -> None:
    """The package's warnings reach stderr as plain lines, whatever TensorFlow did to logging.

    Importing TensorFlow may configure the root logger (prefixing every line with
    its level and logger name); a worker's one line per membership change should
    read the same everywhere. A handler the user set up is left alone.
    """
    package = logging.getLogger("tensorflow_elastic")
    if not package.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        package.addHandler(handler)
        package.setLevel(logging.WARNING)
        package.propagate = False


def init(endpoint: str | None = None, run_id: str | None = None, token: str | None = None,
         address: str | None = None, min_nodes: int | None = None,
         max_nodes: int | None = None, tls_ca: str | None = None) -> ElasticRuntime:
    """Connects this process to its elastic job; arguments default to the launcher's environment."""
    global _runtime
    with _runtime_lock:
        if _runtime is not None:
            return _runtime
        memory.limit_arenas()
        memory.pool_tensors()
        _show_own_messages()
        endpoint = endpoint or environment.text(environment.ENDPOINT)
        if not endpoint:
            raise ElasticJobFailed(
                f"no orchestrator endpoint: start the script with tfelastic-run, or pass "
                f"tensorflow_elastic.init(endpoint='HOST:PORT'), or set {environment.ENDPOINT}")
        run_id = run_id or environment.text(environment.RUN_ID, "default")
        token = token or environment.text(environment.TOKEN)
        tls_ca = tls_ca or environment.text(environment.TLS_CA)
        exit_timeout = environment.duration(environment.EXIT_TIMEOUT, DEFAULT_EXIT_TIMEOUT_S)
        address, reservation = _reserve(address or environment.text(environment.ADDRESS))
        min_nodes = min_nodes or environment.integer(environment.MIN_NODES, 1)
        bounds = NodeBounds(min_nodes, max_nodes or environment.integer(environment.MAX_NODES,
                                                                         max(min_nodes, 1)))
        interrupts = CollectiveInterrupter()
        session = MembershipSession(
            Client(endpoint, run_id, token, tls_ca=tls_ca,
                   retry_timeout=environment.number(environment.ORCHESTRATOR_WAIT,
                                                    DEFAULT_ORCHESTRATOR_WAIT_S)),
            address, bounds, on_peers_lost=interrupts.peers_lost,
            join_timeout=environment.number(environment.JOIN_TIMEOUT, DEFAULT_JOIN_TIMEOUT_S),
            progress_timeout=environment.number(environment.PROGRESS_TIMEOUT,
                                                DEFAULT_PROGRESS_TIMEOUT_S),
            step_events_every=environment.integer(environment.STEP_EVENTS_EVERY, 10),
            barrier_timeout=environment.number(environment.BARRIER_TIMEOUT,
                                               DEFAULT_BARRIER_TIMEOUT_S),
            node_file_path=environment.text(environment.NODE_FILE, ""),
            spare=Spare.from_environment())
        runtime = ElasticRuntime(
            session, interrupts, address_reservation=reservation, exit_timeout=exit_timeout,
            death_notice=death_notice_lib.holder_from_env(
                environment.pop(environment.DEATH_NOTICE_FD)))
        runtime.start()
        _runtime = runtime
        pass_recoverable_errors_at_once(lambda: runtime.training)
        return runtime


def ensure_initialized(min_nodes: int | None = None, max_nodes: int | None = None) -> ElasticRuntime:
    """The runtime, initialized if needed; bounds that contradict the running job are an error."""
    if _runtime is None:
        return init(min_nodes=min_nodes, max_nodes=max_nodes)
    bounds = _runtime.session.bounds
    for name, asked, actual in (("min_nodes", min_nodes, bounds.min_nodes),
                                ("max_nodes", max_nodes, bounds.max_nodes)):
        if asked is not None and asked != actual:
            raise ValueError(
                f"{name}={asked} differs from the job's {name}={actual} (set by "
                f"tensorflow_elastic.init() or the launcher's --nnodes/--nworkers); pass the same bounds "
                f"or leave them out")
    return _runtime


def current_or_none() -> ElasticRuntime | None:
    return _runtime


def current() -> ElasticRuntime:
    if _runtime is None:
        raise ElasticJobFailed("tensorflow_elastic.init() has not been called in this process")
    return _runtime
