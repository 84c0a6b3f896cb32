"""A small synchronous client of etcd's v3 gRPC API: the calls the etcd store and the leader
election need, over the generated ``etcd.proto`` subset (no third-party etcd package: the
maintained ones pin another protobuf runtime).

``etcd://HOST:PORT[,HOST:PORT...][/PREFIX]`` names the cluster and the key prefix every
key of this orchestrator lives under; ``etcds://`` the same over TLS. A call that an etcd
member does not answer moves on to the next member; errors come back as
:class:`EtcdUnavailable`, and a request over etcd's size limit as :class:`EtcdRequestTooLarge`.
With a user, every call carries the token etcd gave for its password (fetched again when
etcd lets it expire).
"""

from __future__ import annotations

import dataclasses
import threading
import urllib.parse
from typing import Callable, Iterator, TypeVar

import grpc

from tensorflow_elastic.proto import etcd_pb2 as epb
from tensorflow_elastic.proto import etcd_pb2_grpc as epb_grpc

SCHEME = "etcd://"
TLS_SCHEME = "etcds://"
DEFAULT_PREFIX = "/tfelastic"
CALL_TIMEOUT_S = 2.0
# Keys per page of a scan: a page of values of at most 256 KiB stays under gRPC's 4 MiB
# receive limit. A page of larger values (written by others) is asked again in halves.
SCAN_PAGE = 12

T = TypeVar("T")


class EtcdUnavailable(Exception):
    """No etcd member answered the call in time (restarting, partitioned, overloaded)."""


class EtcdRequestTooLarge(Exception):
    """etcd refused a request over its size limit (``--max-request-bytes``, 1.5 MiB by
    default): sending it again cannot help, and it says nothing of who leads."""


@dataclasses.dataclass(frozen=True)
class EtcdUrl:
    endpoints: tuple[str, ...]
    prefix: str
    tls: bool = False


@dataclasses.dataclass(frozen=True)
class EtcdAccess:
    """How this orchestrator proves itself to etcd: TLS files (PEM paths; ``ca`` checks etcd's
    certificate, ``cert``/``key`` are this client's, for etcd's --client-cert-auth) and an etcd
    user with its password."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    user: str | None = None
    password: str | None = None


def parse_url(url: str) -> EtcdUrl:
    """``etcd[s]://h1:p1,h2:p2/prefix`` -> its members and key prefix; ValueError when
    malformed."""
    scheme = next((s for s in (SCHEME, TLS_SCHEME) if url.startswith(s)), None)
    if scheme is None:
        raise ValueError(f"{url!r} is not an etcd store: give "
                         f"etcd://HOST:PORT[,HOST:PORT][/PREFIX] (etcds:// for TLS)")
    rest = url[len(scheme):]
    members, _, path = rest.partition("/")
    endpoints = tuple(m.strip() for m in members.split(",") if m.strip())
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"etcd member {endpoint!r} in {url!r} is not HOST:PORT")
    if not endpoints:
        raise ValueError(f"no etcd member in {url!r}: give etcd://HOST:PORT[,HOST:PORT][/PREFIX]")
    prefix = "/" + urllib.parse.unquote(path).strip("/") if path.strip("/") else DEFAULT_PREFIX
    return EtcdUrl(endpoints, prefix, tls=scheme == TLS_SCHEME)


def prefix_end(prefix: bytes) -> bytes:
    """The range end that covers every key starting with ``prefix`` (etcd's convention)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


def _channel(endpoint: str, tls: bool, access: EtcdAccess) -> grpc.Channel:
    if not tls:
        return grpc.insecure_channel(endpoint)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(access.ca), private_key=_read(access.key),
        certificate_chain=_read(access.cert))
    return grpc.secure_channel(endpoint, credentials)


class EtcdClient:
    """Calls etcd members in turn until one answers; thread-safe."""

    def __init__(self, endpoints: tuple[str, ...], timeout: float = CALL_TIMEOUT_S, *,
                 tls: bool = False, access: EtcdAccess = EtcdAccess()):
        if (access.cert is None) != (access.key is None):
            raise ValueError("an etcd client certificate needs its key (and the key its "
                             "certificate)")
        if (access.user is None) != (access.password is None):
            raise ValueError("an etcd user needs its password (and the password its user)")
        if not tls and (access.ca or access.cert):
            raise ValueError("etcd TLS files need an etcds:// store")
        self._channels = [_channel(e, tls, access) for e in endpoints]
        self._kv = [epb_grpc.KVStub(c) for c in self._channels]
        self._lease = [epb_grpc.LeaseStub(c) for c in self._channels]
        self._auth = [epb_grpc.AuthStub(c) for c in self._channels]
        self._endpoints = endpoints
        self._access = access
        self._current = 0
        self._lock = threading.Lock()
        # The token of the etcd user (None: no user, or not yet fetched).
        self._token: str | None = None
        self.timeout = timeout

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    @property
    def _metadata(self) -> tuple[tuple[str, str], ...]:
        return (("token", self._token),) if self._token else ()

    def _authenticate(self, index: int) -> None:
        """Gets a token for the etcd user from member ``index`` (etcd checks the password)."""
        response = self._auth[index].Authenticate(epb.AuthenticateRequest(
            name=self._access.user, password=self._access.password), timeout=self.timeout)
        self._token = response.token

    def _call(self, what: str, attempt: Callable[[int], T],
              on_unanswered: Callable[[], None] = lambda: None) -> T:
        """``attempt(i)`` against member i, from the current one on, until one answers.
        ``on_unanswered()`` hears of every attempt that got no answer (it may have been
        applied all the same)."""
        errors = []
        for _ in range(len(self._endpoints)):
            index = self._current
            try:
                if self._access.user and self._token is None:
                    self._authenticate(index)
                try:
                    return attempt(index)
                except grpc.RpcError as e:
                    if e.code() != grpc.StatusCode.UNAUTHENTICATED or not self._access.user:
                        raise
                    self._authenticate(index)  # the token expired: once more with a new one
                    return attempt(index)
            except grpc.RpcError as e:
                if (e.code() == grpc.StatusCode.INVALID_ARGUMENT
                        and "too large" in (e.details() or "")):
                    raise EtcdRequestTooLarge(f"etcd refused {what}: {e.details()}") from None
                if e.code() not in (grpc.StatusCode.UNAVAILABLE,
                                    grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
                on_unanswered()
                errors.append(f"{self._endpoints[index]}: {e.code().name} {e.details()}")
                with self._lock:
                    if self._current == index:
                        self._current = (index + 1) % len(self._endpoints)
        raise EtcdUnavailable(f"no etcd member answered {what}: {'; '.join(errors)}")

    def _range(self, request: epb.RangeRequest) -> epb.RangeResponse:
        return self._call("Range", lambda i: self._kv[i].Range(
            request, timeout=self.timeout, metadata=self._metadata))

    def get(self, key: bytes) -> epb.KeyValue | None:
        kvs = self._range(epb.RangeRequest(key=key)).kvs
        return kvs[0] if kvs else None

    def scan(self, prefix: bytes, keys_only: bool = False) -> Iterator[epb.KeyValue]:
        """Every key under ``prefix``, page by page: no answer grows past gRPC's receive limit
        however many keys there are. Pages are read at etcd's latest revision each (a pinned
        one may be compacted meanwhile): a caller that must see one revision writes alone."""
        end, start, limit = prefix_end(prefix), prefix, SCAN_PAGE
        while True:
            request = epb.RangeRequest(key=start, range_end=end, limit=limit,
                                       keys_only=keys_only)
            try:
                response = self._range(request)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or limit == 1:
                    raise
                limit //= 2  # values larger than this client writes: a smaller page
                continue
            yield from response.kvs
            if not response.more or not response.kvs:
                return
            start = response.kvs[-1].key + b"\0"

    def txn(self, compare: list[epb.Compare], success: list[epb.RequestOp],
            failure: list[epb.RequestOp] = (),
            on_unanswered: Callable[[], None] = lambda: None) -> epb.TxnResponse:
        request = epb.TxnRequest(compare=compare, success=success, failure=list(failure))
        try:
            return self._call("Txn", lambda i: self._kv[i].Txn(request, timeout=self.timeout,
                                                              metadata=self._metadata),
                              on_unanswered)
        except grpc.RpcError as e:
            # Past etcd's request limit plus gRPC's margin, its gRPC server refuses the request.
            if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise EtcdRequestTooLarge(f"etcd refused a transaction of {request.ByteSize()} "
                                          f"bytes as too large: {e.details()}") from None
            raise

    def grant(self, ttl: int) -> epb.LeaseGrantResponse:
        response = self._call("LeaseGrant", lambda i: self._lease[i].LeaseGrant(
            epb.LeaseGrantRequest(TTL=ttl), timeout=self.timeout, metadata=self._metadata))
        if response.error:
            raise EtcdUnavailable(f"etcd refused a lease: {response.error}")
        return response

    def keep_alive(self, lease_id: int) -> int:
        """Renews the lease once; returns its TTL (0: the lease is gone)."""
        def attempt(index: int) -> int:
            stream = self._lease[index].LeaseKeepAlive(
                iter([epb.LeaseKeepAliveRequest(ID=lease_id)]), timeout=self.timeout,
                metadata=self._metadata)
            try:
                return next(stream).TTL
            finally:
                stream.cancel()

        return self._call("LeaseKeepAlive", attempt)

    def revoke(self, lease_id: int) -> None:
        self._call("LeaseRevoke", lambda i: self._lease[i].LeaseRevoke(
            epb.LeaseRevokeRequest(ID=lease_id), timeout=self.timeout, metadata=self._metadata))


def put(key: bytes, value: bytes, lease: int = 0) -> epb.RequestOp:
    return epb.RequestOp(request_put=epb.PutRequest(key=key, value=value, lease=lease))


def delete(key: bytes) -> epb.RequestOp:
    return epb.RequestOp(request_delete_range=epb.DeleteRangeRequest(key=key))


def delete_prefix(prefix: bytes) -> epb.RequestOp:
    return epb.RequestOp(request_delete_range=epb.DeleteRangeRequest(
        key=prefix, range_end=prefix_end(prefix)))


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
