"""The client with a list of replicas: it follows a standby's leader hint, skips a replica that
does not answer, and gives up with a clear error after its retry time (one process)."""

from __future__ import annotations

import socket
import time
from concurrent import futures

import grpc
import pytest

from tensorflow_elastic import rpc
from tensorflow_elastic.rendezvous import Client
from tensorflow_elastic.rendezvous.client import split_endpoints
from tensorflow_elastic.rendezvous.errors import (LEADER_METADATA_KEY, NOT_LEADER,
                                                  OrchestratorUnreachableError)
from tensorflow_elastic.rendezvous.server import Orchestrator
from tests.launch.conftest import free_port


class _Standby(grpc.GenericRpcHandler):
    """Refuses every call as a standing-by replica does, naming ``leader``."""

    def __init__(self, leader: str):
        self.leader = leader
        self.calls = 0

    def service(self, details):
        def refuse(request, context):
            self.calls += 1
            context.set_trailing_metadata(((rpc.REASON_METADATA_KEY, NOT_LEADER),
                                           (LEADER_METADATA_KEY, self.leader)))
            context.abort(grpc.StatusCode.UNAVAILABLE, "this replica stands by")

        return grpc.unary_unary_rpc_method_handler(refuse)


@pytest.fixture
def leader():
    with Orchestrator() as server:
        yield server


@pytest.fixture
def standby(leader):
    handler = _Standby(leader.endpoint)
    server = grpc.server(futures.ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    handler.endpoint = f"127.0.0.1:{port}"
    yield handler
    server.stop(0)


def test_split_endpoints():
    assert split_endpoints("a:1, b:2,") == ["a:1", "b:2"]
    with pytest.raises(ValueError, match="HOST:PORT"):
        split_endpoints(" , ")


def test_a_standby_sends_the_client_to_the_leader(standby, leader):
    with Client(f"{standby.endpoint},{leader.endpoint}", "job", retry_timeout=10) as client:
        assert client.register("127.0.0.1:5000", 1, 2) == 0
        assert client.current_endpoint == leader.endpoint
        assert standby.calls == 1
        client.status()
        assert standby.calls == 1  # later calls go straight to the leader


def test_a_leader_that_is_not_listed_is_not_followed(standby):
    """The leader's name comes from etcd: a name that is not one of the client's replicas
    (written by whoever can write to etcd) must not get the client's calls and token."""
    elsewhere = socket.create_server(("127.0.0.1", 0))
    elsewhere.settimeout(0.1)
    standby.leader = f"127.0.0.1:{elsewhere.getsockname()[1]}"
    try:
        with Client(standby.endpoint, "job", token="secret", retry_timeout=1.0) as client:
            with pytest.raises(OrchestratorUnreachableError):
                client.status()
            assert client.current_endpoint == standby.endpoint
        assert standby.calls >= 2  # it kept asking its own replica
        with pytest.raises(socket.timeout):
            elsewhere.accept()  # nobody ever connected to the named leader
    finally:
        elsewhere.close()


def test_a_replica_that_does_not_answer_is_skipped(leader):
    dead = f"127.0.0.1:{free_port()}"
    with Client(f"{dead},{leader.endpoint}", "job", retry_timeout=10) as client:
        assert client.register("127.0.0.1:5000", 1, 2) == 0
        assert client.current_endpoint == leader.endpoint


def test_no_replica_answering_is_a_clear_error_after_the_retry_time():
    dead = ",".join(f"127.0.0.1:{free_port()}" for _ in range(2))
    with Client(dead, "job", retry_timeout=1.0) as client:
        started = time.monotonic()
        with pytest.raises(OrchestratorUnreachableError, match="led the run for 1 s"):
            client.status()
        assert time.monotonic() - started < 5.0
