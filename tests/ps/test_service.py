"""The gRPC service in front of a fake backend: what it checks, refuses and passes on."""

from __future__ import annotations

import json
import threading
from concurrent import futures
from typing import Any

import grpc
import numpy as np
import pytest

from tensorflow_elastic.proto import parameter_server_pb2 as pb
from tensorflow_elastic.proto import parameter_server_pb2_grpc as pb_grpc
from tensorflow_elastic.ps.client import PSClient
from tensorflow_elastic.ps.errors import (BAD_ARGUMENT, BAD_CONFIG, NON_FINITE, UNKNOWN_WORKER,
                                          WRONG_RUN, WRONG_SHAPE, PSError)
from tensorflow_elastic.ps.gradient import Gradient
from tensorflow_elastic.ps.service import ParameterServerService


class FakeParameters:
    """One float32 variable of shape [2] at version 3."""

    version = 3
    specs = [pb.VariableSpec(name="w", dtype="float32", shape=[2])]

    def check(self, arrays: list[np.ndarray]) -> None:
        if [a.shape for a in arrays] != [(2,)]:
            raise ValueError("gradient for w is the wrong shape")

    def snapshot(self) -> tuple[int, list]:
        return self.version, []

    def wait_for(self, version: int, timeout: float, stopped: threading.Event) -> None:
        """Never reaches a newer version."""


class FakeBackend:
    run_id = "run-7"
    policy = "fifo"
    worker_iterations = 0
    lease_seconds = 2.5
    stop_reason = None

    def __init__(self):
        self.parameters = FakeParameters()
        self.stopping = threading.Event()
        self.registered: list[str] = []
        self.forgotten: set[str] = set()
        self.submitted: list[Gradient] = []
        self.diverged: list[tuple[str, str]] = []

    def add_worker(self, worker_id: str, secret: str) -> tuple[str, str]:
        worker_id = worker_id or "0"
        self.registered.append(worker_id)
        self.forgotten.discard(worker_id)
        return worker_id, "secret"

    def renew_lease(self, worker_id: str, secret: str) -> bool:
        return worker_id in self.registered and worker_id not in self.forgotten

    def remove_worker(self, worker_id: str, secret: str, finished: bool, reason: str) -> None:
        self.registered.remove(worker_id)

    def submit(self, gradient: Gradient) -> None:
        self.submitted.append(gradient)

    def wait_dealt_with(self, gradient: Gradient, timeout: float) -> bool:
        return True

    def diverge(self, worker_id: str, what: str) -> None:
        self.diverged.append((worker_id, what))

    def live_workers(self) -> list[str]:
        return list(self.registered)

    def stats(self) -> dict[str, Any]:
        return {"accepted": len(self.submitted)}

    def configure(self, **changes: Any) -> dict[str, Any]:
        if changes.get("synch_block_size", 1) > 4:
            raise ValueError("synch_block_size is above min_to_accept")
        return {"policy": self.policy, **changes}


@pytest.fixture
def served():
    backend = FakeBackend()
    service = ParameterServerService(backend)
    server = grpc.server(futures.ThreadPoolExecutor(4))
    pb_grpc.add_ParameterServerServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    client = PSClient(f"127.0.0.1:{port}", "run-7", call_timeout=10, reconnect_timeout=5)
    yield backend, service, client
    client.close()
    server.stop(None)


def test_registration_describes_what_the_backend_serves(served):
    backend, _, client = served
    registration = client.register()
    assert (registration.worker_id, registration.version, registration.policy) == ("0", 3, "fifo")
    assert registration.lease_seconds == 2.5 and not registration.stop
    assert [v.name for v in registration.variables] == ["w"]
    assert backend.registered == ["0"]


def test_a_request_for_another_run_is_refused_counted_and_changes_nothing(served):
    backend, service, client = served
    client.run_id = "run-8"
    with pytest.raises(PSError) as info:
        client.register()
    assert info.value.reason == WRONG_RUN and info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "'run-7'" in info.value.message
    assert backend.registered == [] and service.refusals.counts() == {WRONG_RUN: 1}


def test_a_gradient_reaches_the_backend_only_when_it_fits(served):
    backend, service, client = served
    client.register()
    with pytest.raises(PSError) as info:
        client.push(3, [np.ones(3, np.float32)])
    assert info.value.reason == WRONG_SHAPE and backend.submitted == []
    client.push(3, [np.ones(2, np.float32)], samples=16, loss=0.25)
    [gradient] = backend.submitted
    assert (gradient.worker, gradient.version, gradient.samples) == ("0", 3, 16)
    assert gradient.loss == 0.25
    assert service.refusals.counts() == {WRONG_SHAPE: 1}


def test_a_forgotten_worker_registers_again_under_its_id_and_the_call_goes_through(served):
    backend, service, client = served
    client.register()
    backend.forgotten.add("0")
    assert client.heartbeat().version == 3
    assert backend.registered == ["0", "0"] and service.refusals.counts() == {UNKNOWN_WORKER: 1}


def test_refused_settings_are_a_bad_config_error(served):
    _, _, client = served
    assert json.loads(client.configure(synch_block_size=2).config_json)["synch_block_size"] == 2
    with pytest.raises(PSError) as info:
        client.configure(synch_block_size=8)
    assert info.value.reason == BAD_CONFIG and "min_to_accept" in info.value.message
    status = client.status()
    assert (status.version, status.policy, json.loads(status.stats_json)) == (3, "fifo",
                                                                            {"accepted": 0})


def test_a_non_finite_loss_is_refused_and_reported_as_the_job_diverging(served):
    backend, service, client = served
    client.register()
    with pytest.raises(PSError) as info:
        client.push(3, [np.ones(2, np.float32)], loss=float("inf"))
    assert info.value.reason == BAD_ARGUMENT and backend.submitted == []
    assert info.value.message == ("loss must be a finite number, got inf: the training diverged "
                                  "and the job ends")
    assert backend.diverged == [("0", "loss became inf")]
    with pytest.raises(PSError) as info:
        client.push(3, [np.array([1.0, np.nan], np.float32)])
    assert info.value.reason == NON_FINITE
    assert backend.diverged[1] == ("0", "gradient for w has NaN or Inf values")


def test_a_number_out_of_range_is_described_by_its_bounds(served):
    _, _, client = served
    client.register()
    with pytest.raises(grpc.RpcError) as info:
        client._stub.Pull(pb.PullRequest(run_id="run-7", worker_id="0", worker_secret="secret",
                                         wait_seconds=float("nan")), timeout=5)
    assert info.value.details() == "wait_seconds must be a finite number >= 0.0, got nan"
    with pytest.raises(PSError) as info:
        client.push(3, [np.ones(2, np.float32)], samples=-1)
    assert "samples must be a finite number in [1, 16777216], got -1" in info.value.message
