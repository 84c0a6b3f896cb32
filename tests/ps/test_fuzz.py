"""Fuzzing the PS gRPC service: random and mutated messages of every method.

Each call must end with a gRPC status within its deadline, the server must
answer a valid call afterwards, and its memory must stay bounded. Seeded, so
a failure repeats.
"""

from __future__ import annotations

import random
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf

from tensorflow_elastic.proto import parameter_server_pb2 as pb
from tensorflow_elastic.ps.client import PSClient
from tensorflow_elastic.ps.config import PSConfig
from tensorflow_elastic.ps.server import ParameterServer

MESSAGES = 300
TIME_CAP_S = 60.0
CALL_DEADLINE_S = 2.0
RSS_GROWTH_CAP_BYTES = 50 << 20
SEED = 17

METHODS = {
    "Register": (pb.RegisterRequest, pb.RegisterResponse),
    "Pull": (pb.PullRequest, pb.PullResponse),
    "Push": (pb.PushRequest, pb.PushResponse),
    "Heartbeat": (pb.HeartbeatRequest, pb.PushResponse),
    "Leave": (pb.LeaveRequest, pb.LeaveResponse),
    "Status": (pb.StatusRequest, pb.StatusResponse),
    "Configure": (pb.ConfigureRequest, pb.ConfigureResponse),
}
NUMBERS = [0, 1, -1, 2, 7, 2**31, -2**31, 2**62, -2**63, 2**63 - 1]
FLOATS = [0.0, -0.0, 0.5, -1.0, 1e308, -1e308, 5e-324, float("nan"), float("inf"),
          float("-inf"), 30.0, 1e9]
DTYPES = ["float32", "float64", "float16", "int64", "int8", "bool", "complex64", "object",
          "V0", "S0", "<U3", ">f4", "nonsense", ""]


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def random_tensor(rng: random.Random) -> pb.RawTensor:
    shape = [rng.choice([0, 1, 4, -1, -4, 2**40, 3]) for _ in range(rng.randint(0, 3))]
    size = rng.choice([0, 3, 16, 17, 64])
    return pb.RawTensor(dtype=rng.choice(DTYPES), shape=shape, data=rng.randbytes(size))


def random_value(field, rng: random.Random, known: dict[str, str]):
    """A random value for one field, often a known id, secret or run id so that calls get
    past the first checks."""
    kind = field.type
    if kind == field.TYPE_STRING:
        if field.name in known and rng.random() < 0.6:
            return known[field.name]
        return rng.choice(["", "0", "1", "99", "x" * rng.randint(1, 300), "\u00e9\u2603"])
    if kind in (field.TYPE_INT64, field.TYPE_INT32):
        return rng.choice(NUMBERS)
    if kind == field.TYPE_DOUBLE:
        return rng.choice(FLOATS)
    if kind == field.TYPE_BOOL:
        return rng.random() < 0.5
    raise AssertionError(f"no generator for {field.full_name}")


def random_message(request_type, rng: random.Random, known: dict[str, str]):
    message = request_type()
    for field in request_type.DESCRIPTOR.fields:
        if rng.random() < 0.2:
            continue
        if field.message_type is not None:  # repeated RawTensor
            for _ in range(rng.randint(0, 3)):
                message.gradients.append(random_tensor(rng))
        else:
            setattr(message, field.name, random_value(field, rng, known))
    return message


def mutate(data: bytes, rng: random.Random) -> bytes:
    """Flipped, dropped, inserted or truncated bytes of a serialized message."""
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        choice = rng.randrange(4)
        if choice == 0 and data:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif choice == 1 and data:
            del data[rng.randrange(len(data))]
        elif choice == 2:
            data.insert(rng.randrange(len(data) + 1), rng.randrange(256))
        elif data:
            del data[rng.randrange(len(data)):]
    return bytes(data)


@pytest.fixture
def server():
    server = ParameterServer([tf.Variable(np.ones(4, np.float32))], tf.keras.optimizers.SGD(0.1),
                             PSConfig(policy="fifo"), lease_timeout=60.0, idle_timeout=600.0)
    server.start()
    yield server
    server.stop(grace=0.1)


def test_random_and_mutated_messages_each_get_a_status_and_the_server_stays_up(server):
    rng = random.Random(SEED)
    client = PSClient(server.address, server.run_id, call_timeout=5.0, reconnect_timeout=2.0)
    client.register()
    known = {"run_id": server.run_id, "worker_id": client.worker_id,
             "worker_secret": client.worker_secret}
    raw_calls = {name: client._channel.unary_unary(f"/tensorflow_elastic.ps.ParameterServer/{name}",
                                                   request_serializer=None,
                                                   response_deserializer=None)
                 for name in METHODS}
    baseline = rss_bytes()
    codes: dict[str, int] = {}
    started = time.monotonic()
    sent = 0
    while sent < MESSAGES and time.monotonic() - started < TIME_CAP_S:
        name = rng.choice(list(METHODS))
        data = random_message(METHODS[name][0], rng, known).SerializeToString()
        if rng.random() < 0.4:
            data = mutate(data, rng)
        call_started = time.monotonic()
        try:
            raw_calls[name](data, timeout=CALL_DEADLINE_S)
            code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            code = e.code()
        assert time.monotonic() - call_started < CALL_DEADLINE_S + 3.0, f"{name} hung"
        assert code != grpc.StatusCode.UNKNOWN, f"{name} raised in the server on {data!r}"
        codes[code.name] = codes.get(code.name, 0) + 1
        sent += 1
    assert sent >= 100, f"only {sent} messages in {TIME_CAP_S} s"
    assert codes.get("INVALID_ARGUMENT", 0) > 0 and codes.get("OK", 0) > 0, codes
    # Still serving: a valid worker (registered again if the fuzz made it leave) and Status.
    fresh = PSClient(server.address, server.run_id, call_timeout=5.0, reconnect_timeout=5.0)
    fresh.register()
    assert fresh.heartbeat().version >= 0
    assert fresh.status().policy == "fifo"
    assert rss_bytes() - baseline < RSS_GROWTH_CAP_BYTES
    fresh.close()
    client.close()
