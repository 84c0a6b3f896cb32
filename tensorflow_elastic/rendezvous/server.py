"""The orchestrator server: gRPC (asyncio) + health + metrics, in a thread of its own.

The server runs on an asyncio event loop so that thousands of calls can block
(joins waiting for a generation, watch streams, barriers) without a thread
each. The loop runs in a background thread, so the same class serves the
``tfelastic-orchestrator`` command and the launcher, which embeds it with
``Orchestrator(host, port).start()``.
"""

from __future__ import annotations

import asyncio
import threading

import grpc
import prometheus_client as prom
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tensorflow_elastic import net, rpc
from tensorflow_elastic.observability import events as ev
from tensorflow_elastic.observability.events import EventLog
from tensorflow_elastic.rendezvous import auth, etcd
from tensorflow_elastic.rendezvous.errors import LEADER_METADATA_KEY, NOT_LEADER, NotLeaderError
from tensorflow_elastic.rendezvous.etcd_store import EtcdStore, leader_key
from tensorflow_elastic.rendezvous.leader import DEFAULT_TTL_S, Election
from tensorflow_elastic.rendezvous.metrics import Metrics
from tensorflow_elastic.rendezvous.service import RendezvousService
from tensorflow_elastic.rendezvous.settings import RunSettings
from tensorflow_elastic.rendezvous.store import FileStore, MemoryStore

SERVICE_NAME = "tensorflow_elastic.Rendezvous"

_SERVER_OPTIONS = [
    # Fail loudly when the port is taken instead of silently sharing it.
    ("grpc.so_reuseport", 0),
    # Notice dead peers of held-open calls (joins, watches) even without traffic.
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_concurrent_streams", 100_000),
    # Calls that arrive faster than the serving loop takes them up wait for it: by default
    # gRPC cancels those beyond 3,000, and the 10,000 joins of a large job's start then come
    # back again and again, each retry costing more than waiting would.
    ("grpc.server.max_pending_requests", 100_000),
    ("grpc.server.max_pending_requests_hard_limit", 100_000),
]


class Orchestrator:
    """An orchestrator serving in the background of this process.

    ``port`` 0 picks a free port; read :attr:`port` after :meth:`start`.
    Without ``state_dir`` the state lives in memory only. With ``store``
    (``etcd[s]://HOST:PORT[,HOST:PORT][/PREFIX]``, reached with ``store_access``'s TLS
    files and user) it is one of several replicas: it leads while it holds the etcd
    leader key (``leader_ttl`` seconds of lease) and stands by otherwise, refusing
    calls with ``not_leader`` and the leader's address (``advertise``, default
    HOST:PORT; required when HOST is every interface) so that clients go there.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, state_dir: str | None = None,
                 token: str | None = None, tls_cert: str | None = None,
                 tls_key: str | None = None, metrics_port: int | None = None,
                 metrics_host: str = "127.0.0.1", events_file: str | None = None,
                 settings: RunSettings | None = None, store: str | None = None,
                 advertise: str | None = None, leader_ttl: int = DEFAULT_TTL_S,
                 store_access: etcd.EtcdAccess = etcd.EtcdAccess()):
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("TLS needs both a certificate and its key (--tls_cert and --tls_key)")
        if store is not None and state_dir is not None:
            raise ValueError("give either a state directory or an etcd store, not both")
        if store is not None:
            check_advertise(host, advertise)
        self._etcd = etcd.parse_url(store) if store is not None else None
        self._store_access = store_access
        self._advertise = advertise
        self._leader_ttl = leader_ttl
        self.host = host
        self.port = port
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self._state_dir = state_dir
        self._token = token
        self._tls = (tls_cert, tls_key) if tls_cert and tls_key else None
        self._events = EventLog(events_file, source="orchestrator")
        self._settings = settings or RunSettings()
        self._metrics = Metrics()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stopping: asyncio.Event | None = None
        self._grace = 1.0

    @property
    def metrics_registry(self) -> prom.CollectorRegistry:
        """The orchestrator's metrics, for a launcher that serves them with its own."""
        return self._metrics.registry

    @property
    def endpoint(self) -> str:
        """HOST:PORT to give clients (``--rdzv_endpoint``)."""
        return net.format_address(self.host, self.port)

    def start(self, timeout: float = 30.0) -> "Orchestrator":
        """Starts serving; returns once the port is bound (raises if it cannot be)."""
        self._thread = threading.Thread(target=self._run_loop, name="tfelastic-orchestrator",
                                        daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"the orchestrator did not start within {timeout:g} s")
        if self._error is not None:
            self._thread.join()
            raise self._error
        return self

    def stop(self, grace: float = 1.0) -> None:
        """Stops serving; calls in flight get ``grace`` seconds to finish."""
        if self._loop is None or self._thread is None or not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._signal_stop(grace), self._loop)
        self._thread.join()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        """Blocks until the server stops."""
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> "Orchestrator":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- internals

    def _run_loop(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as e:  # reported to start(); nothing else can see this thread
            self._error = e
            self._ready.set()
        finally:
            self._loop.close()
            self._events.close()

    async def _signal_stop(self, grace: float) -> None:
        self._grace = grace
        self._stopping.set()

    def _bind(self, server: grpc.aio.Server) -> int:
        address = net.format_address(self.host, self.port)
        try:
            if self._tls:
                port = server.add_secure_port(address, auth.server_credentials(*self._tls))
            else:
                port = server.add_insecure_port(address)
        except RuntimeError:
            port = 0
        if port == 0:
            raise OSError(f"cannot listen on {address}: the port is taken or the host is not "
                          f"an address of this machine; pick another --port (0 picks a free one)")
        return port

    async def _serve(self) -> None:
        self._stopping = asyncio.Event()
        if self._etcd is not None:
            await self._serve_replica()
            return
        store = FileStore(self._state_dir) if self._state_dir else MemoryStore()
        service = RendezvousService(self._settings, store, self._events, self._metrics)
        await service.load()
        server = await self._start_server(service.method_handlers())
        try:
            await self._ready_until_stopped()
        finally:
            await self._stop_server(server)
            await service.close()
            self._metrics.close()

    async def _start_server(self, handler: grpc.GenericRpcHandler | dict[str, grpc.RpcMethodHandler]
                            ) -> grpc.aio.Server:
        """A server of ``handler``: the service's methods by name, or a handler that routes
        every call itself (a replica's gate)."""
        interceptors = ([auth.TokenInterceptor(self._token, self._metrics.rpc_refused)]
                        if self._token else [])
        server = grpc.aio.server(interceptors=interceptors, options=_SERVER_OPTIONS)
        if isinstance(handler, dict):
            # Registered methods: gRPC's core matches them itself and takes a unary call's
            # request in with the call, a quarter less of the serving loop per Join than a
            # generic handler's lookup (what a formation of 10,000 nodes spends most on).
            server.add_registered_method_handlers(SERVICE_NAME, handler)
        else:
            server.add_generic_rpc_handlers((handler,))
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        self.port = self._bind(server)
        await server.start()
        for name in ("", SERVICE_NAME):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        server.health = health_servicer
        return server

    async def _stop_server(self, server: grpc.aio.Server, grace: float | None = None) -> None:
        await server.health.enter_graceful_shutdown()
        await server.stop(self._grace if grace is None else grace)

    async def _ready_until_stopped(self) -> None:
        self._announce_ready()
        await self._stopping.wait()

    def _announce_ready(self) -> None:
        if self.metrics_port is not None:
            self.metrics_port = self._metrics.serve(self.metrics_host, self.metrics_port)
        self._ready.set()

    async def _serve_replica(self) -> None:
        """Stands by until this replica holds the leader key, leads until it loses it, and
        so on until stopped. Leading starts from the runs in etcd; losing the lead ends every
        call in flight (the server restarts on the same port), so clients move on at once."""
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()
        client = etcd.EtcdClient(self._etcd.endpoints, tls=self._etcd.tls,
                                 access=self._store_access)
        try:
            await loop.run_in_executor(None, _check_access, client, self._etcd)
        except OSError:
            client.close()
            raise
        gate = _LeaderGate()
        server = await self._start_server(gate)
        election = Election(client, leader_key(self._etcd.prefix),
                            self._advertise or self.endpoint, self._leader_ttl,
                            on_change=lambda: loop.call_soon_threadsafe(changed.set))
        gate.election = election
        service: RendezvousService | None = None
        election.start()
        self._announce_ready()
        stopping = loop.create_task(self._stopping.wait())
        try:
            while not self._stopping.is_set():
                woken = loop.create_task(changed.wait())
                await asyncio.wait([woken, stopping], return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
                changed.clear()
                if election.leading and service is None:
                    previous = election.previous
                    service = await self._lead(client, election)
                    if service is not None:
                        gate.handler = service.handler()
                        self._record_elected(election.identity, previous, service)
                elif not election.leading and service is not None:
                    gate.handler = None
                    service.halt()  # before the calls end: their broken streams decide nothing
                    self._events.record(ev.LEADER_LOST, replica=election.identity,
                                        cause=election.lost_cause)
                    await self._stop_server(server, grace=0)
                    await service.close()
                    service = None
                    server = await self._start_server(gate)
        finally:
            stopping.cancel()
            gate.handler = None
            if service is not None:
                service.halt()  # before the lease goes: a successor may lead from then on
            election.stop()
            await self._stop_server(server)
            if service is not None:
                await service.close()
            client.close()
            self._metrics.close()

    async def _lead(self, client: etcd.EtcdClient, election: Election) -> RendezvousService | None:
        """The service of a new term, its runs loaded from etcd (None: the lead was lost)."""
        store = EtcdStore(client, self._etcd.prefix, election, on_conflict=election.step_down)
        service = RendezvousService(self._settings, store, self._events, self._metrics)
        try:
            await service.load()
        except NotLeaderError:
            await service.close()
            return None
        return service

    def _record_elected(self, identity: str, previous: str | None,
                        service: RendezvousService) -> None:
        fields = {"replica": identity, "runs": service.run_count}
        if previous:
            self._events.record(ev.ORCHESTRATOR_FAILOVER, previous=previous, **fields)
        else:
            self._events.record(ev.LEADER_ELECTED, **fields)


def _check_access(client: etcd.EtcdClient, url: etcd.EtcdUrl) -> None:
    """OSError when etcd refuses this orchestrator (user, password, permissions): a replica
    that cannot read its prefix would only log failed elections. An etcd that does not answer
    yet is waited for, as ever."""
    try:
        client.get(leader_key(url.prefix))
    except etcd.EtcdUnavailable:
        pass
    except grpc.RpcError as e:
        raise OSError(f"etcd at {','.join(url.endpoints)} refused this orchestrator "
                      f"({e.code().name}: {e.details()}); check --etcd_user and its password, "
                      f"and the user's permissions on {url.prefix}") from None


def check_advertise(host: str, advertise: str | None) -> None:
    """ValueError unless the replica has an address clients can be sent to: the leader key
    names it, and every interface (0.0.0.0) is nowhere to connect to."""
    if advertise is None:
        if net.is_wildcard(host):
            raise ValueError(f"--host {host} listens on every interface, which is no address "
                             f"to send clients to: give --advertise HOST:PORT, the address "
                             f"clients reach this replica at (one of their --rdzv_endpoint)")
        return
    advertised_host, _ = net.parse_address(advertise)
    if net.is_wildcard(advertised_host):
        raise ValueError(f"--advertise {advertise} is no address to connect to: give this "
                         f"replica's host name or IP address")


class _LeaderGate(grpc.GenericRpcHandler):
    """Routes membership calls to the service of the current term while this replica leads;
    refuses them otherwise, naming the leader (``not_leader``: the client goes there)."""

    def __init__(self):
        self.election: Election | None = None
        self.handler: grpc.GenericRpcHandler | None = None
        self._refusal = grpc.unary_unary_rpc_method_handler(self._refuse)

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if not details.method.startswith(f"/{SERVICE_NAME}/"):
            return None
        handler = self.handler
        if handler is not None and self.election is not None and self.election.leading:
            return handler.service(details)
        return self._refusal

    async def _refuse(self, request: bytes, context: grpc.aio.ServicerContext) -> None:
        election = self.election
        leader = "" if election is None or election.leader == election.identity \
            else election.leader
        where = (f"the leader is {leader}" if leader
                 else "no replica leads right now (an election is under way)")
        await context.abort(grpc.StatusCode.UNAVAILABLE,
                            f"this orchestrator replica stands by; {where}: retry there",
                            trailing_metadata=((rpc.REASON_METADATA_KEY, NOT_LEADER),
                                               (LEADER_METADATA_KEY, leader)))
