"""A worker's connection to the parameter server, riding out PS restarts.

Calls retry while the PS is unreachable (it may be restarting from its
checkpoint) or its gradient queue is full, up to ``reconnect_timeout``; a PS
that no longer knows the worker (restarted, or the lease expired) gets a
re-registration under the same id (one for all the worker's threads) and the
call is repeated once with the new secret. Every call carries the shared token
(if any) and the worker's secret from Register.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Sequence, TypeVar

import grpc
import numpy as np

from tensorflow_elastic import rpc
from tensorflow_elastic.proto import parameter_server_pb2 as pb
from tensorflow_elastic.proto import parameter_server_pb2_grpc as pb_grpc
from tensorflow_elastic.ps import security, tensors
from tensorflow_elastic.ps.errors import NOT_THE_WORKER, QUEUE_FULL, UNKNOWN_WORKER, PSError
from tensorflow_elastic.memory import keep_large_buffers
from tensorflow_elastic.rendezvous import auth

logger = logging.getLogger(__name__)

T = TypeVar("T")
_RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
_BACKOFF_MAX_S = 1.0


class PSClient:
    """``token``: the PS's shared token; ``tls_ca_file``: connect over TLS trusting this PEM;
    ``max_message_bytes`` (-1: no limit): the largest message sent or received, e.g.
    :func:`tensors.message_limit` of the model."""

    def __init__(self, address: str, run_id: str = "default", *, call_timeout: float = 60.0,
                 reconnect_timeout: float = 120.0, token: str | None = None,
                 tls_ca_file: str | None = None, max_message_bytes: int = -1):
        self.address = address
        self.run_id = run_id
        self.worker_id = ""
        self.worker_secret = ""
        self.call_timeout = call_timeout
        self.reconnect_timeout = reconnect_timeout
        self.max_message_bytes = max_message_bytes
        self._metadata = auth.metadata(token)
        self._channel = security.open_channel(
            address, [("grpc.max_receive_message_length", max_message_bytes),
                      ("grpc.max_send_message_length", max_message_bytes)], tls_ca_file)
        self._stub = pb_grpc.ParameterServerStub(self._channel)
        self.registration: pb.RegisterResponse | None = None
        # One re-registration at a time: the heartbeat thread and the training loop both find
        # out when a restarted PS forgot the worker.
        self._registering = threading.Lock()
        keep_large_buffers()

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "PSClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: Callable[..., T], request: Any, timeout: float | None = None,
              reregister: bool = True) -> T:
        attempt_timeout = timeout or self.call_timeout
        try:
            # A full queue means the PS is behind: the pause pushes back on this worker.
            return rpc.call_with_retry(
                lambda: method(request, timeout=attempt_timeout, metadata=self._metadata),
                _RETRYABLE, time.monotonic() + self.reconnect_timeout, _BACKOFF_MAX_S,
                retry_reasons=(QUEUE_FULL,))
        except grpc.RpcError as e:
            error = rpc.rebuild_error(e, PSError)
        if error.reason in (UNKNOWN_WORKER, NOT_THE_WORKER) and reregister and self.worker_id:
            with self._registering:
                sent_secret = request.worker_secret
                if sent_secret == self.worker_secret:
                    if error.reason == NOT_THE_WORKER:
                        raise error  # our current secret is refused: another process has this id
                    logger.warning("parameter server forgot worker %s (%s); registering again",
                                   self.worker_id, error.message)
                    self.register()
                # else another thread registered again meanwhile: retry with its secret
                request.worker_secret = self.worker_secret
            return self._call(method, request, timeout, reregister=False)
        if error.code in _RETRYABLE:
            error = PSError(f"parameter server at {self.address} unreachable for "
                            f"{self.reconnect_timeout:.0f} s ({error.message})", error.code)
        raise error

    def register(self) -> pb.RegisterResponse:
        response = self._call(self._stub.Register,
                              pb.RegisterRequest(run_id=self.run_id, worker_id=self.worker_id,
                                                 worker_secret=self.worker_secret),
                              reregister=False)
        self.worker_id = response.worker_id
        self.worker_secret = response.worker_secret
        self.registration = response
        return response

    def pull(self, have_version: int = -1, min_version: int = 0,
             wait_seconds: float = 0.0) -> pb.PullResponse:
        request = pb.PullRequest(run_id=self.run_id, worker_id=self.worker_id,
                                 worker_secret=self.worker_secret, have_version=have_version,
                                 min_version=min_version, wait_seconds=wait_seconds)
        return self._call(self._stub.Pull, request, timeout=self.call_timeout + wait_seconds)

    def push(self, version: int, gradients: Sequence[np.ndarray], samples: int = 1,
             loss: float | None = None) -> pb.PushResponse:
        request = pb.PushRequest(run_id=self.run_id, worker_id=self.worker_id,
                                 worker_secret=self.worker_secret, version=version,
                                 samples=samples, loss=loss)
        tensors.encode_into(request.gradients, gradients)
        # Sizing a message costs a pass over it: only when there is a limit to check.
        if self.max_message_bytes >= 0 and request.ByteSize() > self.max_message_bytes:
            raise ValueError(f"this gradient is {request.ByteSize()} bytes, above "
                             f"max_message_bytes ({self.max_message_bytes}, from the model's "
                             f"size); push gradients of the model's variables only")
        return self._call(self._stub.Push, request)

    def heartbeat(self) -> pb.PushResponse:
        return self._call(self._stub.Heartbeat,
                          pb.HeartbeatRequest(run_id=self.run_id, worker_id=self.worker_id,
                                              worker_secret=self.worker_secret))

    def leave(self, finished: bool, reason: str = "") -> None:
        self._call(self._stub.Leave, pb.LeaveRequest(
            run_id=self.run_id, worker_id=self.worker_id, worker_secret=self.worker_secret,
            finished=finished, reason=reason), reregister=False)

    def status(self) -> pb.StatusResponse:
        return self._call(self._stub.Status, pb.StatusRequest(run_id=self.run_id))

    def configure(self, **changes: int) -> pb.ConfigureResponse:
        return self._call(self._stub.Configure, pb.ConfigureRequest(run_id=self.run_id, **changes))
