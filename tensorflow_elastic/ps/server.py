"""The parameter server process: the model's variables, the master loop, and the gRPC service.

One thread runs the master loop (take gradients, order them by the policy,
aggregate, apply); gRPC handler threads only check requests and queue
gradients, so a slow worker never holds up the others. The job ends when a
stop was decided (iteration total or convergence) and every worker has
acknowledged it, or when every worker has finished its own iterations. A
worker's NaN or Inf loss or gradient ends it too, with :class:`TrainingDiverged`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from concurrent import futures
from typing import Any, Callable, Sequence

import grpc

from tensorflow_elastic.errors import TrainingDiverged
from tensorflow_elastic.observability import events
from tensorflow_elastic.observability.events import EventLog
from tensorflow_elastic.observability.progress import PS_SOURCE
from tensorflow_elastic.proto import parameter_server_pb2_grpc as pb_grpc
from tensorflow_elastic.ps import security, tensors
from tensorflow_elastic.ps.checkpoint import Checkpointer
from tensorflow_elastic.ps.config import PSConfig
from tensorflow_elastic.ps.gradient import Gradient
from tensorflow_elastic.ps.master import STOP_DIVERGED, WORKER_ADDED, WORKER_REMOVED, Master
from tensorflow_elastic.memory import keep_large_buffers
from tensorflow_elastic.ps.parameters import Parameters
from tensorflow_elastic.ps.refusals import Refusals
from tensorflow_elastic.ps.registry import WorkerRegistry
from tensorflow_elastic.ps.service import DEFAULT_MAX_SAMPLES, ParameterServerService

logger = logging.getLogger(__name__)

CHECKPOINT_SAVED = "checkpoint_saved"
_MASTER_POLL_S = 0.02
# Handler threads no waiting call may take: heartbeats and status calls always get one.
RESERVED_HANDLER_THREADS = 8


class NoWorkersError(RuntimeError):
    """The PS waited ``idle_timeout`` seconds without a single live worker."""


class ParameterServer:
    """Serves ``variables`` to workers and applies their gradients with ``optimizer``.

    ``checkpoint_dir`` makes the PS save every ``checkpoint_every`` updates and
    resume from the newest checkpoint when it starts again (workers reconnect
    by themselves). Workers silent for ``lease_timeout`` seconds are dropped.
    ``on_update(version)`` runs on the master thread after every update (e.g.
    to evaluate the model); it delays the next update while it runs.

    ``token`` makes every call carry the shared token; ``tls_cert_file`` and
    ``tls_key_file`` (PEM) serve over TLS. Messages are bounded by the model's
    size (:func:`tensors.message_limit`), a push's ``samples`` by
    ``max_samples``; of the ``handler_threads`` (idle ones cost nothing),
    :data:`RESERVED_HANDLER_THREADS` are never taken by waiting pulls or pushes.
    """

    def __init__(self, variables: Sequence[Any], optimizer: Any, config: PSConfig | None = None,
                 *, host: str = "127.0.0.1", port: int = 0, run_id: str = "default",
                 checkpoint_dir: str | None = None, checkpoint_every: int = 100,
                 lease_timeout: float = 10.0, idle_timeout: float = 300.0,
                 events_file: str | None = None, step_events_every: int = 10,
                 handler_threads: int = 128, on_update: Callable[[int], None] | None = None,
                 token: str | None = None, tls_cert_file: str | None = None,
                 tls_key_file: str | None = None, max_samples: int = DEFAULT_MAX_SAMPLES):
        config = config or PSConfig()
        config.validate()
        keep_large_buffers()
        for name, value in (("checkpoint_every", checkpoint_every), ("idle_timeout", idle_timeout),
                            ("lease_timeout", lease_timeout), ("max_samples", max_samples),
                            ("step_events_every", step_events_every)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value}")
        if handler_threads <= RESERVED_HANDLER_THREADS:
            raise ValueError(f"handler_threads must be above {RESERVED_HANDLER_THREADS} (the "
                             f"threads kept for heartbeats), got {handler_threads}")
        self.run_id = run_id
        self.parameters = Parameters(variables, optimizer)
        self.registry = WorkerRegistry(lease_timeout)
        self.master = Master(config, self._apply, on_event=self._on_master_event)
        self.stopping = threading.Event()
        self._events = EventLog(events_file, source=PS_SOURCE)
        self._checkpointer = (Checkpointer(checkpoint_dir, self.parameters.variables, optimizer)
                              if checkpoint_dir else None)
        self._checkpoint_every = checkpoint_every
        self._saved_version = 0
        self._idle_timeout = idle_timeout
        self._step_events_every = step_events_every
        self._host, self._port = host, port
        self._handler_threads = handler_threads
        self._on_update = on_update
        self._token = token
        self._tls_files = (tls_cert_file, tls_key_file)
        self.refusals = Refusals()
        self._service = ParameterServerService(
            self, self.refusals, max_samples=max_samples,
            max_waiting_calls=handler_threads - RESERVED_HANDLER_THREADS)
        self._server: grpc.Server | None = None
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._shutdown = threading.Event()
        self.error: BaseException | None = None
        self.restored_version: int | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def address(self) -> str:
        return f"{self._host}:{self._port}"

    @property
    def worker_iterations(self) -> int:
        """What each worker counts itself: its iterations in the synchronous policy."""
        config = self.master.config
        return config.iterations or 0 if config.is_synchronous else 0

    def start(self) -> "ParameterServer":
        self._restore()
        limit = tensors.message_limit(self.parameters.specs)
        interceptors = [security.TokenGate(self._token, self.refusals)] if self._token else []
        server = grpc.server(futures.ThreadPoolExecutor(self._handler_threads,
                                                        thread_name_prefix="ps-rpc"),
                             interceptors=interceptors,
                             options=[("grpc.max_receive_message_length", limit),
                                      ("grpc.max_send_message_length", limit)])
        pb_grpc.add_ParameterServerServicer_to_server(self._service, server)
        port = security.add_port(server, f"{self._host}:{self._port}", *self._tls_files)
        if port == 0:
            raise OSError(f"cannot listen on {self._host}:{self._port}; pick a free port")
        self._port = port
        server.start()
        self._server = server
        self._thread = threading.Thread(target=self._loop, name="ps-master", daemon=True)
        self._thread.start()
        logger.info("parameter server for run %r listening on %s", self.run_id, self.address)
        return self

    def wait(self, timeout: float | None = None) -> bool:
        """True once the job ended (raises what ended it, if it failed)."""
        done = self._done.wait(timeout)
        if done and self.error is not None:
            raise self.error
        return done

    def stop(self, grace: float = 1.0) -> None:
        self._shutdown.set()
        self.stopping.set()
        self.parameters.wake_waiters()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._server is not None:
            self._server.stop(grace).wait(grace + 5)

    def __enter__(self) -> "ParameterServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def policy(self) -> str:
        return self.master.config.policy

    @property
    def lease_seconds(self) -> float:
        return self.registry.lease_timeout

    @property
    def stop_reason(self) -> str | None:
        return self.master.stop_reason

    # ------------------------------------------------------------------- workers

    def add_worker(self, worker_id: str, secret: str) -> tuple[str, str]:
        worker_id, secret, is_new = self.registry.register(worker_id, secret)
        if is_new:
            self.master.add_worker(worker_id)
            self._record(events.NODE_JOINED, node=_node(worker_id), role="worker")
        return worker_id, secret

    def renew_lease(self, worker_id: str, secret: str) -> bool:
        """False for a worker the PS does not know (it must register again)."""
        return self.registry.touch(worker_id, secret)

    def live_workers(self) -> list[str]:
        return self.registry.live()

    def submit(self, gradient: Gradient) -> None:
        self.master.submit(gradient)

    def wait_dealt_with(self, gradient: Gradient, timeout: float) -> bool:
        return self.master.wait_dealt_with(gradient, timeout)

    def diverge(self, worker_id: str, what: str) -> None:
        self.master.diverge(worker_id, what)

    def remove_worker(self, worker_id: str, secret: str, finished: bool, reason: str) -> None:
        """A worker's own goodbye: its work is done (``finished``) or it was preempted.

        Either way the gradients it pushed before still count (the master only
        drops those of workers whose lease expired).
        """
        if self.registry.remove(worker_id, secret, finished=finished):
            self.master.remove_worker(worker_id, finished=True)
            self._record(events.NODE_LEFT, node=_node(worker_id), reason=reason)

    # --------------------------------------------------------------- master loop

    def _loop(self) -> None:
        idle_since = time.monotonic()
        try:
            while not self._shutdown.is_set():
                self.master.run_once(_MASTER_POLL_S)
                # Between iterations the master's counts match the variables' version.
                if self.parameters.version - self._saved_version >= self._checkpoint_every:
                    self._save_checkpoint()
                for worker_id in self.registry.expired():
                    self.master.remove_worker(worker_id, finished=False)
                    self._record(events.FAILURE_DETECTED, node=_node(worker_id),
                                 failed=[_node(worker_id)], cause="lease expired")
                if self.master.should_stop() and not self.stopping.is_set():
                    self._begin_stop(self.master.stop_message or self.master.stop_reason or "stop")
                live = self.registry.live()
                if live:
                    idle_since = time.monotonic()
                elif self.stopping.is_set() or self.registry.finished > 0:
                    if (not self._expects_more_workers()
                            or time.monotonic() - idle_since > self.registry.lease_timeout):
                        break
                elif time.monotonic() - idle_since > self._idle_timeout:
                    raise NoWorkersError(
                        f"no worker for {self._idle_timeout:.0f} s (version "
                        f"{self.parameters.version}); start workers with the PS address "
                        f"{self.address}, or raise idle_timeout")
            if self.master.stop_reason == STOP_DIVERGED:
                # The newest checkpoint stays the last one from before the divergence.
                raise TrainingDiverged(self.master.stop_message)
            self._save_checkpoint()
            if not self._shutdown.is_set():
                self._record(events.JOB_COMPLETE,
                             reason=self.master.stop_reason or "workers finished")
        except BaseException as e:  # the caller of wait() gets it
            self.error = e
            logger.error("parameter server failed: %s", e)
        finally:
            self.master.close()
            self.stopping.set()
            self.parameters.wake_waiters()
            self._done.set()

    def _expects_more_workers(self) -> bool:
        """Fewer workers than ``config.workers`` ever registered: one still starting is told
        that the job ended (for a lease) rather than left retrying a PS that is gone."""
        workers = self.master.config.workers
        return workers is not None and self.master.peak_workers < workers

    def _begin_stop(self, reason: str) -> None:
        logger.info("stopping at version %d: %s; waiting for workers to acknowledge",
                    self.parameters.version, reason)
        self.stopping.set()
        self.parameters.wake_waiters()

    def _apply(self, arrays: list, version: int) -> None:
        self.parameters.apply(arrays, version)
        if self._on_update is not None:
            self._on_update(version)
        if version % self._step_events_every == 0:
            self._record(events.STEP, version=version, step=version,
                         loss=self.master.stats().get("last_loss"),
                         workers=len(self.registry.live()))

    # --------------------------------------------------------------- checkpoints

    def _save_checkpoint(self) -> None:
        if self._checkpointer is None:
            return
        version = self.parameters.version
        self._saved_version = version
        state = self.master.state_dict()
        state["next_worker_id"] = self.registry.next_id
        path = self._checkpointer.save(version, state)
        self._record(CHECKPOINT_SAVED, version=version, path=path)

    def _restore(self) -> None:
        if self._checkpointer is None:
            return
        restored = self._checkpointer.restore()
        if restored is None:
            return
        version, state = restored
        self.registry.next_id = int(state.pop("next_worker_id", 0))
        self.master.load_state_dict(state)
        self.parameters.set_version(version)
        self.restored_version = self._saved_version = version
        self._record(events.STATE_RESTORED, version=version, step=version, lost_steps=None,
                     source_checkpoint=self._checkpointer.directory)
        logger.info("resumed from checkpoint at version %d", version)

    # -------------------------------------------------------------------- status

    def stats(self) -> dict[str, Any]:
        stats = dict(self.master.stats())
        stats["bad_requests"] = self.refusals.counts()
        stats["version"] = self.parameters.version
        stats["workers"] = self.registry.live()
        return stats

    def configure(self, **changes: Any) -> dict[str, Any]:
        """Changes settings while training runs; returns those in force (ValueError: refused)."""
        self.master.update_config(**changes)
        return dataclasses.asdict(self.master.config)

    def _on_master_event(self, name: str, **fields: Any) -> None:
        if name in (WORKER_ADDED, WORKER_REMOVED):
            return  # recorded as node_joined / node_left, the names every part uses
        self._record(name, **fields)

    def _record(self, event: str, node: int | str | None = None, **fields: Any) -> None:
        """Records a PS event under the parameter version (``generation`` is the membership's
        elsewhere; a PS has none)."""
        fields.setdefault("version", self.parameters.version)
        self._events.record(event, node=node, **fields)


def _node(worker_id: str) -> int | str:
    return int(worker_id) if worker_id.isdigit() else worker_id
