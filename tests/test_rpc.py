"""The shared gRPC conventions: retry with backoff until a deadline, typed errors over the wire."""

from __future__ import annotations

import time
import types
from concurrent import futures

import grpc
import pytest

from tensorflow_elastic import rpc
from tensorflow_elastic.proto import rendezvous_pb2 as pb
from tensorflow_elastic.ps.errors import FUTURE_VERSION, PSError
from tensorflow_elastic.rendezvous.client import Client
from tensorflow_elastic.rendezvous.errors import (BAD_REQUEST, STALE_GENERATION,
                                                  GenerationChangedError, InvalidArgumentError,
                                                  RendezvousError)

_METHOD = "/test.Echo/Call"


class _Failure(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode):
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code


class _Attempts:
    """Fails with the given codes in turn, then returns "ok"."""

    def __init__(self, *codes: grpc.StatusCode):
        self.codes = list(codes)
        self.count = 0

    def __call__(self) -> str:
        self.count += 1
        if self.codes:
            raise _Failure(self.codes.pop(0))
        return "ok"


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    """The pauses call_with_retry takes, recorded instead of slept."""
    slept: list[float] = []
    monkeypatch.setattr(rpc, "time", types.SimpleNamespace(monotonic=time.monotonic,
                                                           sleep=slept.append))
    return slept


@pytest.fixture
def longest_pauses(monkeypatch) -> None:
    """The jitter always draws the longest pause it may, so the pauses are predictable."""
    monkeypatch.setattr(rpc, "random", types.SimpleNamespace(uniform=lambda low, high: high))


def test_a_retried_code_is_tried_again_with_doubling_pauses_up_to_the_most(sleeps,
                                                                          longest_pauses):
    unavailable = grpc.StatusCode.UNAVAILABLE
    attempt = _Attempts(*[unavailable] * 6)
    result = rpc.call_with_retry(attempt, (unavailable,), time.monotonic() + 60, max_backoff=0.5)
    assert result == "ok" and attempt.count == 7
    assert sleeps == [0.05, 0.1, 0.2, 0.4, 0.5, 0.5]


def test_another_code_fails_at_once(sleeps):
    attempt = _Attempts(grpc.StatusCode.NOT_FOUND)
    with pytest.raises(grpc.RpcError) as info:
        rpc.call_with_retry(attempt, (grpc.StatusCode.UNAVAILABLE,), time.monotonic() + 60, 1.0)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert attempt.count == 1 and sleeps == []


def test_pauses_are_drawn_at_random_below_their_doubling_bound(sleeps):
    unavailable = grpc.StatusCode.UNAVAILABLE
    attempt = _Attempts(*[unavailable] * 40)
    rpc.call_with_retry(attempt, (unavailable,), time.monotonic() + 60, max_backoff=0.4)
    bounds = [0.05, 0.1, 0.2] + [0.4] * 37
    assert all(0 <= pause <= bound for pause, bound in zip(sleeps, bounds))
    # Full jitter: clients shed together do not come back together.
    assert len(set(sleeps)) == len(sleeps) and sum(sleeps) < sum(bounds)


def test_retrying_stops_when_the_next_try_would_start_after_the_deadline(sleeps,
                                                                        longest_pauses):
    attempt = _Attempts(*[grpc.StatusCode.DEADLINE_EXCEEDED] * 100)
    give_up_at = time.monotonic() + 0.3  # the sleeps are not real: only the first pauses fit
    with pytest.raises(grpc.RpcError) as info:
        rpc.call_with_retry(attempt, (grpc.StatusCode.DEADLINE_EXCEEDED,), give_up_at, 1.0)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert sleeps == [0.05, 0.1, 0.2] and attempt.count == 4


def test_patience_counts_from_the_first_failure(sleeps, longest_pauses, monkeypatch):
    """A call that waited long before its first failure still gets its full patience."""
    clock = {"now": 1000.0}
    monkeypatch.setattr(rpc, "time", types.SimpleNamespace(
        monotonic=lambda: clock["now"],
        sleep=lambda s: (sleeps.append(s), clock.__setitem__("now", clock["now"] + s))))
    unavailable = grpc.StatusCode.UNAVAILABLE

    def attempt():
        clock["now"] += 50.0 if not sleeps else 0.0  # the first attempt waits on the server
        raise _Failure(unavailable)

    with pytest.raises(grpc.RpcError):
        rpc.call_with_retry(attempt, (unavailable,), 1000.0 + 600, 0.4, patience=1.0)
    # Retried for 1 s from the failure at t=1050, although the call began at t=1000.
    assert sleeps == [0.05, 0.1, 0.2, 0.4] and sum(sleeps) <= 1.0


def _serve_one(service: str, method: str, behaviour) -> tuple[grpc.Server, int]:
    """A started in-process server on a free port whose one unary method is ``behaviour``."""
    handler = grpc.method_handlers_generic_handler(service, {
        method: grpc.unary_unary_rpc_method_handler(behaviour)})
    server = grpc.server(futures.ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


@pytest.fixture
def refusing_server():
    """An in-process server whose one method refuses with the error the test sets."""
    refusal: list[rpc.ServiceError] = []

    def call(request: bytes, context: grpc.ServicerContext) -> bytes:
        rpc.abort(context, refusal[0])

    server, port = _serve_one("test.Echo", "Call", call)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")

    def refuse_with(error: rpc.ServiceError) -> grpc.RpcError:
        refusal[:] = [error]
        with pytest.raises(grpc.RpcError) as info:
            channel.unary_unary(_METHOD)(b"", timeout=10)
        return info.value

    yield refuse_with
    channel.close()
    server.stop(None)


def test_a_rendezvous_error_keeps_its_class_code_and_reason_across_grpc(refusing_server):
    failure = refusing_server(GenerationChangedError("generation 3 ended; re-join"))
    error = rpc.rebuild_error(failure, RendezvousError)
    assert type(error) is GenerationChangedError
    assert (error.code, error.reason, error.message) == (
        grpc.StatusCode.FAILED_PRECONDITION, STALE_GENERATION, "generation 3 ended; re-join")
    failure = refusing_server(InvalidArgumentError("node_id is missing"))
    assert type(rpc.rebuild_error(failure, RendezvousError)) is InvalidArgumentError


def test_a_ps_error_keeps_its_reason_across_grpc(refusing_server):
    failure = refusing_server(PSError("pull before computing", grpc.StatusCode.INVALID_ARGUMENT,
                                      FUTURE_VERSION))
    error = rpc.rebuild_error(failure, PSError)
    assert type(error) is PSError and error.reason == FUTURE_VERSION
    assert str(error) == "INVALID_ARGUMENT: future_version: pull before computing"


def test_a_failure_without_a_reason_is_the_family_base_class():
    channel = grpc.insecure_channel("127.0.0.1:1")  # nothing listens on port 1
    with pytest.raises(grpc.RpcError) as info:
        channel.unary_unary(_METHOD)(b"", timeout=10)
    channel.close()
    error = rpc.rebuild_error(info.value, RendezvousError)
    assert type(error) is RendezvousError and error.code == grpc.StatusCode.UNAVAILABLE
    assert error.reason == BAD_REQUEST and error.message
    error = rpc.rebuild_error(info.value, PSError)
    assert error.reason == "" and str(error).startswith("UNAVAILABLE: ")


@pytest.fixture
def shedding_orchestrator():
    """An in-process stand-in for the orchestrator whose Status sheds the first calls with
    CANCELLED (as a loaded server does), then answers; yields its endpoint and call count."""
    calls = {"count": 0, "shed": 0}

    def status(request: bytes, context: grpc.ServicerContext) -> bytes:
        calls["count"] += 1
        if calls["count"] <= calls["shed"]:
            context.abort(grpc.StatusCode.CANCELLED, "shed under load")
        return pb.StatusResponse(runs=[pb.RunStatus(run_id="job", state=pb.FORMING)]).SerializeToString()

    server, port = _serve_one("tensorflow_elastic.Rendezvous", "Status", status)
    yield f"127.0.0.1:{port}", calls
    server.stop(None)


def test_a_call_the_server_shed_with_cancelled_is_retried_until_it_succeeds(
        shedding_orchestrator):
    endpoint, calls = shedding_orchestrator
    calls["shed"] = 4
    with Client(endpoint, "job", retry_timeout=30.0) as client:
        runs = client.status()
    assert [r.run_id for r in runs] == ["job"] and calls["count"] == 5
