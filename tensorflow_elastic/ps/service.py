"""The ParameterServer gRPC service: checks every request, then hands it to the PS.

A bad request (wrong job id, unknown worker, a gradient of the wrong shape
or dtype, a version from the future) gets an error status that says what is
wrong, is counted by reason, and changes nothing.
"""

from __future__ import annotations

import collections
import json
import threading
from typing import TYPE_CHECKING, NoReturn

import grpc

from tensorflow_elastic.proto import parameter_server_pb2 as pb
from tensorflow_elastic.proto import parameter_server_pb2_grpc as pb_grpc
from tensorflow_elastic.ps import tensors
from tensorflow_elastic.ps.reasons import (BAD_CONFIG, FUTURE_VERSION, MALFORMED, UNKNOWN_WORKER,
                                           WRONG_JOB, WRONG_SHAPE)
from tensorflow_elastic.ps.master import Gradient

if TYPE_CHECKING:
    from tensorflow_elastic.ps.server import ParameterServer

MAX_PULL_WAIT_S = 30.0



class ParameterServerService(pb_grpc.ParameterServerServicer):
    def __init__(self, ps: "ParameterServer"):
        self._ps = ps
        self._lock = threading.Lock()
        self.bad_requests: collections.Counter[str] = collections.Counter()

    def _reject(self, context: grpc.ServicerContext, code: grpc.StatusCode, reason: str,
                message: str) -> NoReturn:
        with self._lock:
            self.bad_requests[reason] += 1
        context.abort(code, f"{reason}: {message}")

    def _check_job(self, job_id: str, context: grpc.ServicerContext) -> None:
        if job_id != self._ps.job_id:
            self._reject(context, grpc.StatusCode.FAILED_PRECONDITION, WRONG_JOB,
                         f"this parameter server trains job {self._ps.job_id!r}, not {job_id!r}; "
                         f"check the worker's job id")

    def _check_worker(self, worker_id: str, context: grpc.ServicerContext) -> None:
        if not self._ps.registry.touch(worker_id):
            self._reject(context, grpc.StatusCode.NOT_FOUND, UNKNOWN_WORKER,
                         f"worker {worker_id!r} is not registered (new parameter server, or its "
                         f"lease expired); register again")

    def Register(self, request: pb.RegisterRequest, context) -> pb.RegisterResponse:
        self._check_job(request.job_id, context)
        worker_id = self._ps.add_worker(request.worker_id)
        return pb.RegisterResponse(
            worker_id=worker_id, version=self._ps.parameters.version,
            variables=self._ps.parameters.specs, policy=self._ps.master.config.policy,
            iterations=self._ps.worker_iterations, stop=self._ps.stopping.is_set(),
            lease_seconds=self._ps.registry.lease_timeout)

    def Pull(self, request: pb.PullRequest, context) -> pb.PullResponse:
        self._check_job(request.job_id, context)
        self._check_worker(request.worker_id, context)
        params = self._ps.parameters
        if request.min_version > params.version:
            params.wait_for(request.min_version, min(request.wait_seconds, MAX_PULL_WAIT_S),
                            self._ps.stopping)
        version = params.version
        if version == request.have_version:
            # Only a worker ahead of the PS (which restarted from a checkpoint) gets the older
            # parameters again; a current one gets nothing.
            return pb.PullResponse(version=version, stop=self._ps.stopping.is_set())
        version, raws = params.snapshot()
        response = pb.PullResponse(version=version, stop=self._ps.stopping.is_set())
        tensors.add_raw(response.parameters, raws)
        return response

    def Push(self, request: pb.PushRequest, context) -> pb.PushResponse:
        self._check_job(request.job_id, context)
        self._check_worker(request.worker_id, context)
        try:
            arrays = tensors.decode_all(request.gradients)
        except ValueError as e:
            self._reject(context, grpc.StatusCode.INVALID_ARGUMENT, MALFORMED, str(e))
        try:
            self._ps.parameters.check(arrays)
        except ValueError as e:
            self._reject(context, grpc.StatusCode.INVALID_ARGUMENT, WRONG_SHAPE, str(e))
        version = self._ps.parameters.version
        if request.version > version:
            self._reject(context, grpc.StatusCode.INVALID_ARGUMENT, FUTURE_VERSION,
                         f"gradient computed on version {request.version}, but the parameters are "
                         f"at version {version}; pull before computing")
        self._ps.master.submit(Gradient(
            worker=request.worker_id, version=request.version, arrays=arrays,
            samples=max(1, request.samples),
            loss=request.loss if request.HasField("loss") else None))
        return pb.PushResponse(version=self._ps.parameters.version,
                               stop=self._ps.stopping.is_set())

    def Heartbeat(self, request: pb.HeartbeatRequest, context) -> pb.PushResponse:
        self._check_job(request.job_id, context)
        self._check_worker(request.worker_id, context)
        return pb.PushResponse(version=self._ps.parameters.version,
                               stop=self._ps.stopping.is_set())

    def Leave(self, request: pb.LeaveRequest, context) -> pb.LeaveResponse:
        self._check_job(request.job_id, context)
        self._ps.remove_worker(request.worker_id, finished=request.finished,
                               reason=request.reason or ("finished" if request.finished
                                                         else "left"))
        return pb.LeaveResponse()

    def Status(self, request: pb.StatusRequest, context) -> pb.StatusResponse:
        self._check_job(request.job_id, context)
        return pb.StatusResponse(
            version=self._ps.parameters.version, policy=self._ps.master.config.policy,
            workers=self._ps.registry.live(), stats_json=json.dumps(self._ps.stats()),
            stop=self._ps.stopping.is_set(), stop_reason=self._ps.master.stop_reason or "")

    def Configure(self, request: pb.ConfigureRequest, context) -> pb.ConfigureResponse:
        self._check_job(request.job_id, context)
        changes = {field.name: value for field, value in request.ListFields()
                   if field.name != "job_id"}
        try:
            self._ps.master.update_config(**changes)
        except ValueError as e:
            self._reject(context, grpc.StatusCode.INVALID_ARGUMENT, BAD_CONFIG, str(e))
        return pb.ConfigureResponse(config_json=json.dumps(self._ps.config_dict()))
