"""The ParameterServer gRPC service: checks every request, then hands it to the PS.

A bad request (wrong run id, unknown worker, a worker id without its secret,
a gradient of the wrong shape or dtype or with NaN/Inf values, a number out
of range, a version from the future) is refused with a :class:`PSError` that
says what is wrong, is counted by reason, and changes nothing; except that a
registered worker's NaN or Inf loss or gradient, refused all the same, also
ends the job (the training diverged). A full gradient queue is
RESOURCE_EXHAUSTED: the worker retries after a pause. A push returns once the
master has dealt with its gradient, and pulls may wait for a newer version:
each such wait holds a handler thread, so at most ``max_waiting_calls`` wait
at once (the others answer at once) and heartbeats always find a thread. The
service sees the PS only through :class:`Backend`.
"""

from __future__ import annotations

import functools
import json
import math
import threading
from typing import TYPE_CHECKING, Any, Callable, Protocol

import grpc

from tensorflow_elastic import rpc
from tensorflow_elastic.proto import parameter_server_pb2 as pb
from tensorflow_elastic.proto import parameter_server_pb2_grpc as pb_grpc
from tensorflow_elastic.ps import divergence, tensors
from tensorflow_elastic.ps.errors import (BAD_ARGUMENT, BAD_CONFIG, FUTURE_VERSION, MALFORMED,
                                          NON_FINITE, NOT_THE_WORKER, QUEUE_FULL, UNKNOWN_WORKER,
                                          WRONG_RUN, WRONG_SHAPE, PSError)
from tensorflow_elastic.ps.gradient import Gradient
from tensorflow_elastic.ps.master import QueueFull
from tensorflow_elastic.ps.refusals import Refusals
from tensorflow_elastic.ps.registry import NotTheWorker

if TYPE_CHECKING:
    from tensorflow_elastic.ps.parameters import Parameters

MAX_PULL_WAIT_S = 30.0
# A push waits at most this long for the master to deal with its gradient.
MAX_PUSH_WAIT_S = 30.0
# Samples behind one gradient the PS believes by default (the wskew policy weighs by them).
DEFAULT_MAX_SAMPLES = 1 << 24


class Backend(Protocol):
    """What the service needs of the parameter server behind it."""

    run_id: str
    parameters: Parameters       # the versioned variables: specs, check, snapshot, wait_for
    stopping: threading.Event    # set once the job decided to stop; replies say ``stop``

    @property
    def policy(self) -> str: ...

    @property
    def worker_iterations(self) -> int: ...

    @property
    def lease_seconds(self) -> float: ...

    @property
    def stop_reason(self) -> str | None: ...

    # The three below raise NotTheWorker for a live worker id without its secret.
    def add_worker(self, worker_id: str, secret: str) -> tuple[str, str]: ...

    def renew_lease(self, worker_id: str, secret: str) -> bool: ...

    def remove_worker(self, worker_id: str, secret: str, finished: bool, reason: str) -> None: ...

    def submit(self, gradient: Gradient) -> None: ...  # QueueFull when the queue is full

    # True once the master applied, held or rejected the submitted gradient; False on timeout.
    def wait_dealt_with(self, gradient: Gradient, timeout: float) -> bool: ...

    # A registered worker's loss or gradient became NaN or Inf: the job ends, saying ``what``.
    def diverge(self, worker_id: str, what: str) -> None: ...

    def live_workers(self) -> list[str]: ...

    def stats(self) -> dict[str, Any]: ...

    def configure(self, **changes: Any) -> dict[str, Any]: ...


def _refusing(method: Callable[..., Any]) -> Callable[..., Any]:
    """Counts a :class:`PSError` the handler raised by reason and ends the call with it."""

    @functools.wraps(method)
    def handler(self: "ParameterServerService", request: Any,
                context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except NotTheWorker as e:
            error = PSError(str(e), grpc.StatusCode.PERMISSION_DENIED, NOT_THE_WORKER)
        except PSError as e:
            error = e
        self.refusals.record(error.reason, error.message)
        rpc.abort(context, error)

    return handler


def _check_number(name: str, value: float, least: float, most: float = math.inf) -> None:
    """INVALID_ARGUMENT unless ``least <= value <= most`` (NaN and infinities never are)."""
    if not (math.isfinite(value) and least <= value <= most):
        bounds = f">= {least}" if most == math.inf else f"in [{least}, {most}]"
        raise PSError(f"{name} must be a finite number {bounds}, got {value}",
                      grpc.StatusCode.INVALID_ARGUMENT, BAD_ARGUMENT)


class ParameterServerService(pb_grpc.ParameterServerServicer):
    """``max_samples`` bounds a push's ``samples``; ``max_waiting_calls`` (None: no bound) the
    pulls and pushes that wait at once."""

    def __init__(self, backend: Backend, refusals: Refusals | None = None, *,
                 max_samples: int = DEFAULT_MAX_SAMPLES, max_waiting_calls: int | None = None):
        self._backend = backend
        self.refusals = refusals or Refusals()
        self._max_samples = max_samples
        self._wait_slots = (threading.BoundedSemaphore(max_waiting_calls)
                            if max_waiting_calls is not None else None)

    def _check_run(self, run_id: str) -> None:
        if run_id != self._backend.run_id:
            raise PSError(f"this parameter server trains run {self._backend.run_id!r}, not "
                          f"{run_id!r}; check the worker's run id",
                          grpc.StatusCode.FAILED_PRECONDITION, WRONG_RUN)

    def _check_worker(self, worker_id: str, secret: str) -> None:
        if not self._backend.renew_lease(worker_id, secret):
            raise PSError(f"worker {worker_id!r} is not registered (new parameter server, or its "
                          f"lease expired); register again", grpc.StatusCode.NOT_FOUND,
                          UNKNOWN_WORKER)

    def _reply(self) -> pb.PushResponse:
        return pb.PushResponse(version=self._backend.parameters.version,
                               stop=self._backend.stopping.is_set())

    @_refusing
    def Register(self, request: pb.RegisterRequest, context) -> pb.RegisterResponse:
        self._check_run(request.run_id)
        worker_id, secret = self._backend.add_worker(request.worker_id, request.worker_secret)
        return pb.RegisterResponse(
            worker_id=worker_id, worker_secret=secret, version=self._backend.parameters.version,
            variables=self._backend.parameters.specs, policy=self._backend.policy,
            iterations=self._backend.worker_iterations, stop=self._backend.stopping.is_set(),
            lease_seconds=self._backend.lease_seconds)

    @_refusing
    def Pull(self, request: pb.PullRequest, context) -> pb.PullResponse:
        self._check_run(request.run_id)
        _check_number("wait_seconds", request.wait_seconds, 0.0)
        self._check_worker(request.worker_id, request.worker_secret)
        params = self._backend.parameters
        if request.min_version > params.version:
            self._wait(lambda timeout: params.wait_for(request.min_version, timeout,
                                                       self._backend.stopping),
                       min(request.wait_seconds, MAX_PULL_WAIT_S))
        version = params.version
        if version == request.have_version:
            # Only a worker ahead of the PS (which restarted from a checkpoint) gets the older
            # parameters again; a current one gets nothing.
            return pb.PullResponse(version=version, stop=self._backend.stopping.is_set())
        version, raws = params.snapshot()
        response = pb.PullResponse(version=version, stop=self._backend.stopping.is_set())
        tensors.add_raw(response.parameters, raws)
        return response

    def _wait(self, wait: Callable[[float], object], timeout: float) -> None:
        """Calls ``wait(timeout)`` if a wait slot is free; else returns at once (the worker
        goes on), so waiting calls never take the last handler threads."""
        slots = self._wait_slots
        if slots is not None and not slots.acquire(blocking=False):
            return
        try:
            wait(timeout)
        finally:
            if slots is not None:
                slots.release()

    @_refusing
    def Push(self, request: pb.PushRequest, context) -> pb.PushResponse:
        self._check_run(request.run_id)
        self._check_worker(request.worker_id, request.worker_secret)
        if request.samples:
            _check_number("samples", request.samples, 1, self._max_samples)
        if request.HasField("loss") and not math.isfinite(request.loss):
            self._backend.diverge(request.worker_id, divergence.loss_diverged(request.loss))
            raise PSError(f"loss must be a finite number, got {request.loss}: the training "
                          f"diverged and the job ends", grpc.StatusCode.INVALID_ARGUMENT,
                          BAD_ARGUMENT)
        try:
            arrays = tensors.decode_all(request.gradients)
        except ValueError as e:
            raise PSError(str(e), grpc.StatusCode.INVALID_ARGUMENT, MALFORMED) from None
        try:
            self._backend.parameters.check(arrays)
        except ValueError as e:
            raise PSError(str(e), grpc.StatusCode.INVALID_ARGUMENT, WRONG_SHAPE) from None
        bad = tensors.first_non_finite(arrays)
        if bad is not None:
            name = self._backend.parameters.specs[bad].name
            self._backend.diverge(request.worker_id, divergence.gradient_diverged(name))
            raise PSError(f"the gradient for {name} has NaN or Inf values: the training "
                          f"diverged and the job ends; lower the learning rate or clip "
                          f"gradients on the worker", grpc.StatusCode.INVALID_ARGUMENT,
                          NON_FINITE)
        version = self._backend.parameters.version
        if request.version > version:
            raise PSError(f"gradient computed on version {request.version}, but the parameters "
                          f"are at version {version}; pull before computing",
                          grpc.StatusCode.INVALID_ARGUMENT, FUTURE_VERSION)
        gradient = Gradient(worker=request.worker_id, version=request.version, arrays=arrays,
                            samples=request.samples or 1,
                            loss=request.loss if request.HasField("loss") else None)
        try:
            self._backend.submit(gradient)
        except QueueFull as e:
            raise PSError(str(e), grpc.StatusCode.RESOURCE_EXHAUSTED, QUEUE_FULL) from None
        # Back pressure: the worker computes its next gradient on parameters that include this
        # one (or after it was held or refused), not on a version its own backlog makes stale.
        self._wait(lambda timeout: self._backend.wait_dealt_with(gradient, timeout),
                   MAX_PUSH_WAIT_S)
        return self._reply()

    @_refusing
    def Heartbeat(self, request: pb.HeartbeatRequest, context) -> pb.PushResponse:
        self._check_run(request.run_id)
        self._check_worker(request.worker_id, request.worker_secret)
        return self._reply()

    @_refusing
    def Leave(self, request: pb.LeaveRequest, context) -> pb.LeaveResponse:
        self._check_run(request.run_id)
        self._backend.remove_worker(request.worker_id, request.worker_secret,
                                    finished=request.finished,
                                    reason=request.reason or ("finished" if request.finished
                                                              else "left"))
        return pb.LeaveResponse()

    @_refusing
    def Status(self, request: pb.StatusRequest, context) -> pb.StatusResponse:
        self._check_run(request.run_id)
        return pb.StatusResponse(
            version=self._backend.parameters.version, policy=self._backend.policy,
            workers=self._backend.live_workers(), stats_json=json.dumps(self._backend.stats()),
            stop=self._backend.stopping.is_set(), stop_reason=self._backend.stop_reason or "")

    @_refusing
    def Configure(self, request: pb.ConfigureRequest, context) -> pb.ConfigureResponse:
        self._check_run(request.run_id)
        changes = {field.name: value for field, value in request.ListFields()
                   if field.name != "run_id"}
        try:
            config = self._backend.configure(**changes)
        except ValueError as e:
            raise PSError(str(e), grpc.StatusCode.INVALID_ARGUMENT, BAD_CONFIG) from None
        return pb.ConfigureResponse(config_json=json.dumps(config))
