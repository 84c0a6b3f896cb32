"""The ParameterServer gRPC service: checks every request, then hands it to the PS.

A bad request (wrong run id, unknown worker, a gradient of the wrong shape
or dtype, a version from the future) is refused with a :class:`PSError` that
says what is wrong, is counted by reason, and changes nothing. The service
sees the PS only through :class:`Backend`.
"""

from __future__ import annotations

import collections
import functools
import json
import threading
from typing import TYPE_CHECKING, Any, Callable, Protocol

import grpc

from tensorflow_elastic import rpc
from tensorflow_elastic.proto import parameter_server_pb2 as pb
from tensorflow_elastic.proto import parameter_server_pb2_grpc as pb_grpc
from tensorflow_elastic.ps import tensors
from tensorflow_elastic.ps.errors import (BAD_CONFIG, FUTURE_VERSION, MALFORMED, UNKNOWN_WORKER,
                                          WRONG_RUN, WRONG_SHAPE, PSError)
from tensorflow_elastic.ps.gradient import Gradient

if TYPE_CHECKING:
    from tensorflow_elastic.ps.parameters import Parameters

MAX_PULL_WAIT_S = 30.0


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

    def add_worker(self, worker_id: str) -> str: ...

    def renew_lease(self, worker_id: str) -> bool: ...

    def remove_worker(self, worker_id: str, finished: bool, reason: str) -> None: ...

    def submit(self, gradient: Gradient) -> None: ...

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
        except PSError as e:
            with self._lock:
                self.bad_requests[e.reason] += 1
            rpc.abort(context, e)

    return handler


class ParameterServerService(pb_grpc.ParameterServerServicer):
    def __init__(self, backend: Backend):
        self._backend = backend
        self._lock = threading.Lock()
        self.bad_requests: collections.Counter[str] = collections.Counter()

    def _check_run(self, run_id: str) -> None:
        if run_id != self._backend.run_id:
            raise PSError(f"this parameter server trains run {self._backend.run_id!r}, not "
                          f"{run_id!r}; check the worker's run id",
                          grpc.StatusCode.FAILED_PRECONDITION, WRONG_RUN)

    def _check_worker(self, worker_id: str) -> None:
        if not self._backend.renew_lease(worker_id):
            raise PSError(f"worker {worker_id!r} is not registered (new parameter server, or its "
                          f"lease expired); register again", grpc.StatusCode.NOT_FOUND,
                          UNKNOWN_WORKER)

    def _reply(self) -> pb.PushResponse:
        return pb.PushResponse(version=self._backend.parameters.version,
                               stop=self._backend.stopping.is_set())

    @_refusing
    def Register(self, request: pb.RegisterRequest, context) -> pb.RegisterResponse:
        self._check_run(request.run_id)
        worker_id = self._backend.add_worker(request.worker_id)
        return pb.RegisterResponse(
            worker_id=worker_id, version=self._backend.parameters.version,
            variables=self._backend.parameters.specs, policy=self._backend.policy,
            iterations=self._backend.worker_iterations, stop=self._backend.stopping.is_set(),
            lease_seconds=self._backend.lease_seconds)

    @_refusing
    def Pull(self, request: pb.PullRequest, context) -> pb.PullResponse:
        self._check_run(request.run_id)
        self._check_worker(request.worker_id)
        params = self._backend.parameters
        if request.min_version > params.version:
            params.wait_for(request.min_version, min(request.wait_seconds, MAX_PULL_WAIT_S),
                            self._backend.stopping)
        version = params.version
        if version == request.have_version:
            # Only a worker ahead of the PS (which restarted from a checkpoint) gets the older
            # parameters again; a current one gets nothing.
            return pb.PullResponse(version=version, stop=self._backend.stopping.is_set())
        version, raws = params.snapshot()
        response = pb.PullResponse(version=version, stop=self._backend.stopping.is_set())
        tensors.add_raw(response.parameters, raws)
        return response

    @_refusing
    def Push(self, request: pb.PushRequest, context) -> pb.PushResponse:
        self._check_run(request.run_id)
        self._check_worker(request.worker_id)
        try:
            arrays = tensors.decode_all(request.gradients)
        except ValueError as e:
            raise PSError(str(e), grpc.StatusCode.INVALID_ARGUMENT, MALFORMED) from None
        try:
            self._backend.parameters.check(arrays)
        except ValueError as e:
            raise PSError(str(e), grpc.StatusCode.INVALID_ARGUMENT, WRONG_SHAPE) from None
        version = self._backend.parameters.version
        if request.version > version:
            raise PSError(f"gradient computed on version {request.version}, but the parameters "
                          f"are at version {version}; pull before computing",
                          grpc.StatusCode.INVALID_ARGUMENT, FUTURE_VERSION)
        self._backend.submit(Gradient(
            worker=request.worker_id, version=request.version, arrays=arrays,
            samples=max(1, request.samples),
            loss=request.loss if request.HasField("loss") else None))
        return self._reply()

    @_refusing
    def Heartbeat(self, request: pb.HeartbeatRequest, context) -> pb.PushResponse:
        self._check_run(request.run_id)
        self._check_worker(request.worker_id)
        return self._reply()

    @_refusing
    def Leave(self, request: pb.LeaveRequest, context) -> pb.LeaveResponse:
        self._check_run(request.run_id)
        self._backend.remove_worker(request.worker_id, finished=request.finished,
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
