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
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tensorflow_elastic import net
from tensorflow_elastic.observability.events import EventLog
from tensorflow_elastic.rendezvous import auth
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
]


class Orchestrator:
    """An orchestrator serving in the background of this process.

    ``port`` 0 picks a free port; read :attr:`port` after :meth:`start`.
    Without ``state_dir`` the state lives in memory only.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, state_dir: str | None = None,
                 token: str | None = None, tls_cert: str | None = None,
                 tls_key: str | None = None, metrics_port: int | None = None,
                 metrics_host: str = "127.0.0.1", events_file: str | None = None, settings: RunSettings | None = None):
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("TLS needs both a certificate and its key (--tls_cert and --tls_key)")
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
        store = FileStore(self._state_dir) if self._state_dir else MemoryStore()
        service = RendezvousService(self._settings, store, self._events, self._metrics)
        await service.load()
        interceptors = ([auth.TokenInterceptor(self._token, self._metrics.rpc_refused)]
                        if self._token else [])
        server = grpc.aio.server(interceptors=interceptors, options=_SERVER_OPTIONS)
        server.add_generic_rpc_handlers((service.handler(),))
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        self.port = self._bind(server)
        await server.start()
        for name in ("", SERVICE_NAME):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        try:
            if self.metrics_port is not None:
                self.metrics_port = self._metrics.serve(self.metrics_host, self.metrics_port)
            self._ready.set()
            await self._stopping.wait()
        finally:
            await health_servicer.enter_graceful_shutdown()
            await server.stop(self._grace)
            await service.close()
            self._metrics.close()
