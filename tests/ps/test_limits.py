"""What a parameter server refuses so that one bad or greedy caller cannot stall or corrupt it:
non-finite numbers, oversized messages and counts, a full queue, and long-polls that would
hold every handler thread."""

from __future__ import annotations

import json
import threading
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf

from tensorflow_elastic.proto import parameter_server_pb2 as pb
from tensorflow_elastic.proto import parameter_server_pb2_grpc as pb_grpc
from tensorflow_elastic.ps import tensors
from tensorflow_elastic.ps.client import PSClient
from tensorflow_elastic.ps.config import PSConfig
from tensorflow_elastic.ps.gradient import Gradient
from tensorflow_elastic.ps.master import Master, QueueFull
from tensorflow_elastic.ps.server import ParameterServer

SIZE = 4  # the start_ps fixture's model: one float32 variable of this size
CALL_TIMEOUT_S = 10.0



def connect(server: ParameterServer) -> tuple[PSClient, pb_grpc.ParameterServerStub]:
    """A registered client and a raw stub on its channel, for hand-made requests."""
    client = PSClient(server.address, server.run_id, call_timeout=CALL_TIMEOUT_S,
                      reconnect_timeout=5.0)
    client.register()
    return client, pb_grpc.ParameterServerStub(client._channel)


def push_request(client: PSClient, values, **fields) -> pb.PushRequest:
    request = pb.PushRequest(run_id=client.run_id, worker_id=client.worker_id,
                             worker_secret=client.worker_secret, version=0, **fields)
    tensors.encode_into(request.gradients, [np.asarray(values, np.float32)])
    return request


def refused(call, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        call(request, timeout=CALL_TIMEOUT_S)
    return e.value


@pytest.mark.parametrize("wait", [float("nan"), float("inf"), -1.0])
def test_a_pull_with_a_non_finite_or_negative_wait_is_refused_at_once(start_ps, wait):
    server = start_ps()
    client, stub = connect(server)
    started = time.monotonic()
    error = refused(stub.Pull, pb.PullRequest(
        run_id=client.run_id, worker_id=client.worker_id, worker_secret=client.worker_secret,
        min_version=5, wait_seconds=wait))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "wait_seconds" in error.details()
    assert time.monotonic() - started < 5.0
    client.close()


@pytest.mark.parametrize("values, fields", [
    ([np.nan, np.inf, 1.0, 0.0], {}),
    ([1.0, 1.0, 1.0, 1.0], {"loss": float("nan")}),
    ([1.0, 1.0, 1.0, 1.0], {"samples": 10**15}),
    ([1.0, 1.0, 1.0, 1.0], {"samples": -3}),
])
def test_non_finite_gradients_and_losses_and_absurd_samples_are_refused_and_counted(
        start_ps, values, fields):
    server = start_ps()
    client, stub = connect(server)
    before = server.parameters.arrays()[1][0].copy()
    error = refused(stub.Push, push_request(client, values, **fields))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    time.sleep(0.2)  # the master loop would have applied an accepted gradient by now
    np.testing.assert_array_equal(server.parameters.arrays()[1][0], before)
    assert sum(json.loads(client.status().stats_json)["bad_requests"].values()) == 1
    client.close()


def test_a_non_finite_gradient_is_counted_under_its_own_reason(start_ps):
    server = start_ps()
    client, stub = connect(server)
    refused(stub.Push, push_request(client, [np.nan, np.inf, 1.0, 0.0]))
    assert json.loads(client.status().stats_json)["bad_requests"] == {"non_finite": 1}
    client.close()


def test_a_gradient_of_the_wrong_dtype_is_refused_and_counted(start_ps):
    server = start_ps()
    client, stub = connect(server)
    request = pb.PushRequest(run_id=client.run_id, worker_id=client.worker_id,
                             worker_secret=client.worker_secret, version=0)
    tensors.encode_into(request.gradients, [np.ones(SIZE, np.float64)])
    assert refused(stub.Push, request).code() == grpc.StatusCode.INVALID_ARGUMENT
    assert json.loads(client.status().stats_json)["bad_requests"] == {"wrong_shape": 1}
    client.close()


def test_a_message_far_larger_than_the_model_is_refused_by_the_server(start_ps):
    server = start_ps()
    client, stub = connect(server)
    huge = np.ones(tensors.message_limit(server.parameters.specs) // 4 + 1, np.float32)
    error = refused(stub.Push, push_request(client, huge))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert client.heartbeat().version == 0  # still serving
    client.close()


def test_the_client_refuses_to_send_a_message_above_its_limit_and_says_why():
    client = PSClient("127.0.0.1:1", max_message_bytes=1000, reconnect_timeout=0.1)
    with pytest.raises(ValueError, match="max_message_bytes"):
        client.push(0, [np.ones(1000, np.float32)])
    client.close()


def test_the_queue_is_bounded_and_a_full_queue_says_so():
    master = Master(PSConfig(policy="fifo", max_queued=2), lambda arrays, version: None)
    master.add_worker("0")
    for _ in range(2):
        master.submit(Gradient("0", 0, [np.ones(1, np.float32)]))
    with pytest.raises(QueueFull, match="max_queued"):
        master.submit(Gradient("0", 0, [np.ones(1, np.float32)]))
    master.run_once(0.0)
    master.submit(Gradient("0", 0, [np.ones(1, np.float32)]))  # room again once taken


def test_a_full_queue_is_resource_exhausted_and_the_client_retries_until_there_is_room(
        start_ps):
    server = start_ps(PSConfig(policy="fifo", max_queued=1))
    client, stub = connect(server)
    released = threading.Event()

    def release() -> None:
        server.master._loop_lock.release()
        released.set()

    server.master._loop_lock.acquire()  # hold the master loop: nothing leaves the queue
    releaser = threading.Timer(1.0, release)
    try:
        # A push waits until the master has dealt with its gradient: this one is left waiting.
        first = stub.Push.future(push_request(client, np.zeros(SIZE)), timeout=CALL_TIMEOUT_S)
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while server.master.stats()["queued"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        error = refused(stub.Push, push_request(client, np.zeros(SIZE)))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert dict(error.trailing_metadata())["tfe-reason"] == "queue_full"
        releaser.start()
        assert client.push(0, [np.zeros(SIZE, np.float32)]).version >= 0
        assert first.result().version >= 0
    finally:
        releaser.cancel()
        if releaser.is_alive():
            releaser.join()
        if not released.is_set():
            release()
    assert json.loads(client.status().stats_json)["bad_requests"]["queue_full"] >= 1
    client.close()


def test_a_heartbeat_answers_while_more_pulls_wait_than_there_are_handler_threads(start_ps):
    server = start_ps(handler_threads=32)
    client, stub = connect(server)
    waiting = [stub.Pull.future(pb.PullRequest(
        run_id=client.run_id, worker_id=client.worker_id, worker_secret=client.worker_secret,
        min_version=100, wait_seconds=20.0), timeout=30.0) for _ in range(40)]
    time.sleep(1.0)  # every pull has reached the server
    started = time.monotonic()
    assert client._stub.Heartbeat(pb.HeartbeatRequest(
        run_id=client.run_id, worker_id=client.worker_id, worker_secret=client.worker_secret),
        timeout=5.0).version == 0
    assert time.monotonic() - started < 5.0
    server.stop(grace=0.1)
    for future in waiting:
        future.cancel()
    client.close()


@pytest.mark.parametrize("name, value", [("convergence_tolerance", float("nan")),
                                         ("convergence_tolerance", float("inf"))])
def test_non_finite_settings_are_refused(name, value):
    with pytest.raises(ValueError, match=name):
        PSConfig(**{name: value}).validate()


@pytest.mark.parametrize("name", ["lease_timeout", "idle_timeout"])
def test_non_finite_timeouts_are_refused(name):
    with pytest.raises(ValueError, match=name):
        ParameterServer([tf.Variable(np.ones(SIZE, np.float32))], tf.keras.optimizers.SGD(0.1),
                        **{name: float("nan")})
