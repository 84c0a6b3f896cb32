"""A small synchronous client of etcd's v3 gRPC API: the calls the etcd store and the leader
election need, over the generated ``etcd.proto`` subset (no third-party etcd package: the
maintained ones pin another protobuf runtime).

``etcd://HOST:PORT[,HOST:PORT...][/PREFIX]`` names the cluster and the key prefix every
key of this orchestrator lives under. A call that an etcd member does not answer moves on
to the next member; errors come back as :class:`EtcdUnavailable`.
"""

from __future__ import annotations

import dataclasses
import threading
import urllib.parse
from typing import Callable, TypeVar

import grpc

from tensorflow_elastic.proto import etcd_pb2 as epb
from tensorflow_elastic.proto import etcd_pb2_grpc as epb_grpc

SCHEME = "etcd://"
DEFAULT_PREFIX = "/tfelastic"
CALL_TIMEOUT_S = 2.0

T = TypeVar("T")


class EtcdUnavailable(Exception):
    """No etcd member answered the call in time (restarting, partitioned, overloaded)."""


@dataclasses.dataclass(frozen=True)
class EtcdUrl:
    endpoints: tuple[str, ...]
    prefix: str


def parse_url(url: str) -> EtcdUrl:
    """``etcd://h1:p1,h2:p2/prefix`` -> its members and key prefix; ValueError when malformed."""
    if not url.startswith(SCHEME):
        raise ValueError(f"{url!r} is not an etcd store: give "
                         f"etcd://HOST:PORT[,HOST:PORT][/PREFIX]")
    rest = url[len(SCHEME):]
    members, _, path = rest.partition("/")
    endpoints = tuple(m.strip() for m in members.split(",") if m.strip())
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"etcd member {endpoint!r} in {url!r} is not HOST:PORT")
    if not endpoints:
        raise ValueError(f"no etcd member in {url!r}: give etcd://HOST:PORT[,HOST:PORT][/PREFIX]")
    prefix = "/" + urllib.parse.unquote(path).strip("/") if path.strip("/") else DEFAULT_PREFIX
    return EtcdUrl(endpoints, prefix)


def prefix_end(prefix: bytes) -> bytes:
    """The range end that covers every key starting with ``prefix`` (etcd's convention)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


class EtcdClient:
    """Calls etcd members in turn until one answers; thread-safe."""

    def __init__(self, endpoints: tuple[str, ...], timeout: float = CALL_TIMEOUT_S):
        self._channels = [grpc.insecure_channel(e) for e in endpoints]
        self._kv = [epb_grpc.KVStub(c) for c in self._channels]
        self._lease = [epb_grpc.LeaseStub(c) for c in self._channels]
        self._endpoints = endpoints
        self._current = 0
        self._lock = threading.Lock()
        self.timeout = timeout

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    def _call(self, what: str, attempt: Callable[[int], T]) -> T:
        """``attempt(i)`` against member i, from the current one on, until one answers."""
        errors = []
        for _ in range(len(self._endpoints)):
            index = self._current
            try:
                return attempt(index)
            except grpc.RpcError as e:
                if e.code() not in (grpc.StatusCode.UNAVAILABLE,
                                    grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
                errors.append(f"{self._endpoints[index]}: {e.code().name} {e.details()}")
                with self._lock:
                    if self._current == index:
                        self._current = (index + 1) % len(self._endpoints)
        raise EtcdUnavailable(f"no etcd member answered {what}: {'; '.join(errors)}")

    def get(self, key: bytes) -> epb.KeyValue | None:
        kvs = self._call("Range", lambda i: self._kv[i].Range(
            epb.RangeRequest(key=key), timeout=self.timeout)).kvs
        return kvs[0] if kvs else None

    def get_prefix(self, prefix: bytes) -> list[epb.KeyValue]:
        request = epb.RangeRequest(key=prefix, range_end=prefix_end(prefix))
        return list(self._call("Range", lambda i: self._kv[i].Range(
            request, timeout=self.timeout)).kvs)

    def txn(self, compare: list[epb.Compare], success: list[epb.RequestOp],
            failure: list[epb.RequestOp] = ()) -> epb.TxnResponse:
        request = epb.TxnRequest(compare=compare, success=success, failure=list(failure))
        return self._call("Txn", lambda i: self._kv[i].Txn(request, timeout=self.timeout))

    def grant(self, ttl: int) -> epb.LeaseGrantResponse:
        response = self._call("LeaseGrant", lambda i: self._lease[i].LeaseGrant(
            epb.LeaseGrantRequest(TTL=ttl), timeout=self.timeout))
        if response.error:
            raise EtcdUnavailable(f"etcd refused a lease: {response.error}")
        return response

    def keep_alive(self, lease_id: int) -> int:
        """Renews the lease once; returns its TTL (0: the lease is gone)."""
        def attempt(index: int) -> int:
            stream = self._lease[index].LeaseKeepAlive(
                iter([epb.LeaseKeepAliveRequest(ID=lease_id)]), timeout=self.timeout)
            try:
                return next(stream).TTL
            finally:
                stream.cancel()

        return self._call("LeaseKeepAlive", attempt)

    def revoke(self, lease_id: int) -> None:
        self._call("LeaseRevoke", lambda i: self._lease[i].LeaseRevoke(
            epb.LeaseRevokeRequest(ID=lease_id), timeout=self.timeout))


def put(key: bytes, value: bytes, lease: int = 0) -> epb.RequestOp:
    return epb.RequestOp(request_put=epb.PutRequest(key=key, value=value, lease=lease))


def delete(key: bytes) -> epb.RequestOp:
    return epb.RequestOp(request_delete_range=epb.DeleteRangeRequest(key=key))


def get(key: bytes) -> epb.RequestOp:
    return epb.RequestOp(request_range=epb.RangeRequest(key=key))


def created_at(key: bytes, revision: int) -> epb.Compare:
    """True when ``key`` was created at ``revision`` (0: the key does not exist)."""
    return epb.Compare(result=epb.Compare.EQUAL, target=epb.Compare.CREATE, key=key,
                       create_revision=revision)


def modified_at(key: bytes, revision: int) -> epb.Compare:
    """True when ``key`` was last written at ``revision`` (0: the key does not exist)."""
    return epb.Compare(result=epb.Compare.EQUAL, target=epb.Compare.MOD, key=key,
                       mod_revision=revision)
