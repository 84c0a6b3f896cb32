"""Random and mutated messages of every method, sent to a real orchestrator process: every call
gets a gRPC status within its deadline, the server stays up and its memory stays bounded."""

from __future__ import annotations

import math
import random
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from google.protobuf import descriptor as pb_descriptor

from tensorflow_elastic.proto import rendezvous_pb2 as pb

pytestmark = pytest.mark.multiprocess

MESSAGES = 400
SEED = 17
CALL_DEADLINE_S = 1.0
# Time a call may take over its deadline before the test counts it as hanging.
DEADLINE_SLACK_S = 5.0
SENDING_CAP_S = 60.0
RSS_GROWTH_CAP_BYTES = 200 * 1024 * 1024
_SERVICE = pb.DESCRIPTOR.services_by_name["Rendezvous"]
_F = pb_descriptor.FieldDescriptor
_INT32 = (_F.TYPE_INT32, _F.TYPE_SINT32, _F.TYPE_SFIXED32)
_UNSIGNED64 = (_F.TYPE_FIXED64, _F.TYPE_UINT64)


def _string(rng: random.Random) -> str:
    return rng.choice([
        "", "job", "fuzz", "127.0.0.1:20001", "[::1]:1", "host:0", "host:99999", ":1", "²:1",
        "\x00", "é" * rng.randint(1, 300), "x" * rng.choice([255, 257, 5000, 100_000]),
        "".join(chr(rng.randint(1, 0xD7FF)) for _ in range(rng.randint(0, 64))),
    ])


def _integer(rng: random.Random, field: _F) -> int:
    if field.type in _UNSIGNED64:
        low, high = 0, 2**64 - 1
    else:
        low, high = (-2**31, 2**31 - 1) if field.type in _INT32 else (-2**63, 2**63 - 1)
    value = rng.choice([0, 1, 2, 3, -1, low, high, rng.randint(low, high), rng.randint(0, 10)])
    return value % 2**64 if field.type in _UNSIGNED64 else value  # -1: the largest


def _value(rng: random.Random, field: _F) -> object:
    if field.type == _F.TYPE_STRING:
        return _string(rng)
    if field.type == _F.TYPE_BYTES:
        return rng.randbytes(rng.choice([0, 1, 64, 65 * 1024, 300_000]))
    if field.type == _F.TYPE_DOUBLE:
        return rng.choice([0.0, -1.0, 0.001, 0.5, 1e12, math.inf, -math.inf, math.nan])
    if field.type == _F.TYPE_BOOL:
        return rng.random() < 0.5
    if field.type == _F.TYPE_MESSAGE:
        return random_request(rng, getattr(pb, field.message_type.name))
    return _integer(rng, field)


def random_request(rng: random.Random, message_type: type) -> object:
    """A request with each field left out or set to an edge-case value."""
    message = message_type()
    for field in message.DESCRIPTOR.fields:
        if rng.random() < 0.2:
            continue
        if field.is_repeated:
            getattr(message, field.name).extend(
                _value(rng, field) for _ in range(rng.choice([0, 1, 3, 10_000])))
        elif field.type == _F.TYPE_MESSAGE:
            getattr(message, field.name).CopyFrom(_value(rng, field))
        else:
            setattr(message, field.name, _value(rng, field))
    return message


def mutate(rng: random.Random, data: bytes) -> bytes:
    """``data`` with bytes flipped, cut, repeated or made up."""
    data = bytearray(data or b"\x00")
    for _ in range(rng.randint(1, 8)):
        where = rng.randrange(len(data))
        action = rng.randrange(4)
        if action == 0:
            data[where] ^= 1 << rng.randrange(8)
        elif action == 1:
            del data[where:]
            data = data or bytearray(b"\xff")
        elif action == 2:
            data[where:where] = data[:rng.randint(1, 64)]
        else:
            data[where:where] = rng.randbytes(rng.randint(1, 16))
    return bytes(data)


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc status")


def _call(channel: grpc.Channel, method: pb_descriptor.MethodDescriptor,
          data: bytes) -> tuple[grpc.StatusCode, float]:
    """Sends raw request bytes; returns the status code and how long the call took."""
    path = f"/{_SERVICE.full_name}/{method.name}"
    started = time.monotonic()
    try:
        if method.server_streaming:
            stream = (channel.stream_stream(path)(iter([data] * 3), timeout=CALL_DEADLINE_S)
                      if method.client_streaming
                      else channel.unary_stream(path)(data, timeout=CALL_DEADLINE_S))
            try:
                for _ in range(3):
                    next(stream)
            finally:
                stream.cancel()
            code = grpc.StatusCode.OK
        else:
            channel.unary_unary(path)(data, timeout=CALL_DEADLINE_S)
            code = grpc.StatusCode.OK
    except StopIteration:
        code = grpc.StatusCode.OK
    except grpc.RpcError as e:
        code = e.code()
    return code, time.monotonic() - started


def test_random_and_mutated_messages_get_a_status_and_leave_the_server_up(orchestrator):
    rng = random.Random(SEED)
    requests = []
    for _ in range(MESSAGES):
        method = rng.choice(list(_SERVICE.methods))
        data = random_request(rng, getattr(pb, method.input_type.name)).SerializeToString()
        requests.append((method, mutate(rng, data) if rng.random() < 0.4 else data))
    rss_before = _rss_bytes(orchestrator.pid)
    started = time.monotonic()
    with grpc.insecure_channel(orchestrator.endpoint) as channel, ThreadPoolExecutor(32) as pool:
        outcomes = [pool.submit(_call, channel, method, data) for method, data in requests]
        results = [f.result(timeout=SENDING_CAP_S) for f in outcomes]
    assert time.monotonic() - started < SENDING_CAP_S
    assert len(results) == MESSAGES
    slow = [took for _, took in results if took > CALL_DEADLINE_S + DEADLINE_SLACK_S]
    assert not slow, f"{len(slow)} calls went past their deadline: {slow[:5]}"
    codes = {code for code, _ in results}
    assert grpc.StatusCode.INVALID_ARGUMENT in codes  # the fuzz reached the checks
    assert orchestrator.proc.poll() is None
    with grpc.insecure_channel(orchestrator.endpoint) as channel:
        reply = channel.unary_unary(f"/{_SERVICE.full_name}/Status",
                                    request_serializer=pb.StatusRequest.SerializeToString,
                                    response_deserializer=pb.StatusResponse.FromString)(
            pb.StatusRequest(), timeout=30)
    assert isinstance(reply, pb.StatusResponse)
    growth = _rss_bytes(orchestrator.pid) - rss_before
    assert growth < RSS_GROWTH_CAP_BYTES, f"the orchestrator grew by {growth} bytes"
