"""The process's elastic runtime: its membership session wired to TensorFlow, one per process.

`init()` connects to the orchestrator with the settings the launcher puts in
the environment, prepares TensorFlow's collectives for this node's permanent
id and holds the node's port until its TensorFlow server binds it. The
strategy attaches to the runtime; the runtime tells it about re-forms and
aborts its collectives when peers are lost.
"""

from __future__ import annotations

import atexit
import faulthandler
import logging
import signal
import socket
import threading

from tensorflow.python.distribute import distribute_lib

from tensorflow_elastic import environment, memory, net
from tensorflow_elastic.errors import ElasticJobFailed
from tensorflow_elastic.rendezvous import Client, Membership
from tensorflow_elastic.rendezvous.session import (DEFAULT_BARRIER_TIMEOUT_S,
                                                   DEFAULT_JOIN_TIMEOUT_S,
                                                   DEFAULT_ORCHESTRATOR_WAIT_S,
                                                   DEFAULT_PROGRESS_TIMEOUT_S, MembershipSession)
from tensorflow_elastic.strategy import cluster

logger = logging.getLogger(__name__)

DEFAULT_EXIT_TIMEOUT_S = 30.0

_runtime: "ElasticRuntime | None" = None
_runtime_lock = threading.Lock()


class ElasticRuntime:
    """This process's session, its held port and its strategy."""

    def __init__(self, session: MembershipSession,
                 address_reservation: socket.socket | None = None):
        self.session = session
        self._address_reservation = address_reservation
        self.strategy: distribute_lib.Strategy | None = None
        # An abort and a move of TensorFlow to a new generation never interleave: an abort
        # meant for an ended generation must not land on the next one, nor be lost before it.
        self._collectives_lock = threading.Lock()
        # Every generation below this one has ended (the orchestrator announced this one).
        self._ended_below = 0

    def start(self) -> None:
        """Joins (or registers), configures TensorFlow for this node, then follows the membership."""
        self.session.start()
        cluster.configure(self.session.node_id)
        if threading.current_thread() is threading.main_thread():
            # A preemption notice: finish the step, commit, leave; nobody rolls back.
            signal.signal(signal.SIGTERM, lambda signum, frame: self.session.request_leave())
        # Peers are gone: stop waiting on them now rather than at the timeout.
        self.session.on_peers_lost(self._stop_collectives)
        self.session.start_watching()
        atexit.register(self._exit)

    def _exit(self) -> None:
        """At interpreter exit, after success or a fatal error alike: stops this node's threads
        and channels (a gRPC call left open in a daemon thread can hold the exit forever), under
        a deadline that ends the process if anything else holds it."""
        bound_exit(environment.number(environment.EXIT_TIMEOUT, DEFAULT_EXIT_TIMEOUT_S))
        self.session.client.close()
        self.session.close()

    def _serving_generation(self) -> int:
        """The generation TensorFlow's collectives run in (-1 before there is a strategy)."""
        return -1 if self.strategy is None else self.strategy.extended.generation

    def _stop_collectives(self, reason: str, generation: int | None) -> None:
        """Aborts the collectives of the generations that ended before `generation` (None: all)."""
        with self._collectives_lock:
            if generation is not None:
                self._ended_below = max(self._ended_below, generation)
                if self._serving_generation() >= generation:
                    return  # old news: TensorFlow already serves that generation
            cluster.abort_collectives(reason)

    def _regroup(self, membership: Membership) -> None:
        """Moves the strategy to `membership`'s generation (this clears an earlier abort)."""
        with self._collectives_lock:
            self.strategy.extended.regroup(membership.members, membership.generation)
            if membership.generation < self._ended_below:
                # It ended while this node moved to it: nothing else would unblock its
                # first collective (the state sync's broadcast).
                cluster.abort_collectives(f"generation {membership.generation} ended while "
                                          f"this node joined it")

    # What scripts read from `tfe.init()`'s result.

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
        """Makes `strategy` (an ElasticMultiWorkerMirroredStrategy) follow this process's re-forms."""
        if self.strategy is strategy:
            return
        if self.strategy is not None:
            raise RuntimeError("only one ElasticMultiWorkerMirroredStrategy per process")
        self.strategy = strategy
        self.session.on_regroup(self._regroup)

    def report_failure(self, error: BaseException) -> None:
        """Tells the orchestrator which peers this process cannot reach after `error`.

        When the orchestrator has already started a newer generation it knows
        who was lost: the report is only recorded, with no probe of the peers
        (a frozen peer would hold it for the whole probe timeout).
        """
        membership = self.session.membership
        if self._ended_below > membership.generation:
            peers = []
        else:
            peers = cluster.unreachable_peers(membership.members, self.session.node_id)
        self.session.report_failure(peers, type(error).__name__, str(error))


def bound_exit(timeout: float) -> None:
    """Ends the process with exit code 1 (after writing every thread's stack to stderr) unless
    it has ended within `timeout` seconds; an alarm a few seconds later backs this up for a hang
    in native code after the interpreter is gone."""
    faulthandler.dump_traceback_later(timeout, exit=True)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(int(timeout) + 5)


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
        address, reservation = _reserve(address or environment.text(environment.ADDRESS))
        min_nodes = min_nodes or environment.integer(environment.MIN_NODES, 1)
        max_nodes = max_nodes or environment.integer(environment.MAX_NODES, max(min_nodes, 1))
        session = MembershipSession(
            Client(endpoint, run_id, token, tls_ca=tls_ca,
                   retry_timeout=environment.number(environment.ORCHESTRATOR_WAIT,
                                                    DEFAULT_ORCHESTRATOR_WAIT_S)),
            address, min_nodes, max_nodes,
            join_timeout=environment.number(environment.JOIN_TIMEOUT, DEFAULT_JOIN_TIMEOUT_S),
            progress_timeout=environment.number(environment.PROGRESS_TIMEOUT,
                                                DEFAULT_PROGRESS_TIMEOUT_S),
            step_events_every=environment.integer(environment.STEP_EVENTS_EVERY, 10),
            barrier_timeout=environment.number(environment.BARRIER_TIMEOUT,
                                               DEFAULT_BARRIER_TIMEOUT_S))
        runtime = ElasticRuntime(session, address_reservation=reservation)
        runtime.start()
        _runtime = runtime
        return runtime


def ensure_initialized(min_nodes: int | None = None, max_nodes: int | None = None) -> ElasticRuntime:
    """The runtime, initialized if needed; bounds that contradict the running job are an error."""
    if _runtime is None:
        return init(min_nodes=min_nodes, max_nodes=max_nodes)
    session = _runtime.session
    for name, asked, actual in (("min_nodes", min_nodes, session.min_nodes),
                                ("max_nodes", max_nodes, session.max_nodes)):
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
