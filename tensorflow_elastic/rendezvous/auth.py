"""Shared-token authentication and TLS for the orchestrator and its clients.

With a token configured, every call must carry ``authorization: Bearer
<token>``; anything else gets UNAUTHENTICATED with a fixed message, before any
handler runs, so a caller without the token learns nothing about the runs. The
standard health service stays open so that probes (load balancers, Kubernetes)
work without secrets; it reveals only SERVING.

Refused calls are counted (by method, through ``on_refused``) and logged, one
line per peer host and minute at most, so that a misconfigured node or a
prober shows up without flooding the log.
"""

from __future__ import annotations

import hmac
import logging
import os
import time
from typing import Awaitable, Callable

import grpc

from tensorflow_elastic import environment, net, rpc
from tensorflow_elastic.observability.throttle import Throttle

_HEADER = "authorization"
_OPEN_SERVICES = ("/grpc.health.v1.Health/",)
# A peer's refused calls are logged at most once per interval; so many peers are remembered.
REFUSAL_LOG_INTERVAL_S = 60.0
_REFUSAL_LOG_PEERS = 1024

logger = logging.getLogger(__name__)


def exposure_error(host: str, token: str | None, insecure: bool) -> str | None:
    """Why serving membership on ``host`` is refused, or None when it is safe (or allowed).

    Without a token anyone who reaches the port can join nodes or make any node
    leave; on loopback only this machine's users can.
    """
    if token or insecure or net.is_loopback(host):
        return None
    return (f"listening on {host} without a token lets anyone who reaches the port change the "
            f"membership; give --token_file (or ${environment.TOKEN}), or pass --insecure on a "
            f"network you trust")


def load_token(token_file: str | None = None, env: str = environment.TOKEN) -> str | None:
    """The token from ``token_file`` (first line), else from the environment, else None."""
    if token_file:
        with open(token_file, encoding="utf-8") as f:
            token = f.readline().strip()
        if not token:
            raise ValueError(f"token file {token_file} is empty; put the shared token on its "
                             f"first line")
        return token
    return os.environ.get(env) or None


def metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata a client sends with every call."""
    return ((_HEADER, f"Bearer {token}"),) if token else ()


class TokenCheck:
    """Whether a call carries the shared token, compared in constant time."""

    def __init__(self, token: str):
        ((self._header, expected),) = metadata(token)
        self._expected = expected.encode()

    def admits(self, call: grpc.HandlerCallDetails) -> bool:
        presented = dict(call.invocation_metadata or ()).get(self._header, "")
        return hmac.compare_digest(str(presented).encode(), self._expected)


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Rejects calls whose token does not match, in constant time; ``on_refused`` gets the
    method of each refused call."""

    def __init__(self, token: str, on_refused: Callable[[str], None] = lambda method: None):
        self._check = TokenCheck(token)
        self._on_refused = on_refused
        self._log = RefusalLog()

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails],
                                         Awaitable[grpc.RpcMethodHandler]],
            handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        if handler_call_details.method.startswith(_OPEN_SERVICES):
            return await continuation(handler_call_details)
        if self._check.admits(handler_call_details):
            return await continuation(handler_call_details)
        method = handler_call_details.method
        self._on_refused(method)

        async def reject(request: object, context: grpc.aio.ServicerContext) -> None:
            self._log.refused(context.peer(), method)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "missing or wrong token: pass the orchestrator's shared token")

        # Raw bytes in and nothing out: the call is refused before its request is parsed.
        return grpc.unary_unary_rpc_method_handler(reject)


class RefusalLog:
    """Logs refused calls: one line per peer host per :data:`REFUSAL_LOG_INTERVAL_S`, naming
    how many calls were refused since its last line."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._throttle = Throttle(REFUSAL_LOG_INTERVAL_S, clock, _REFUSAL_LOG_PEERS)

    def refused(self, peer: str, method: str) -> None:
        host = rpc.peer_host(peer)
        count = self._throttle.note(host)
        if count:
            logger.warning("refused calls without the right token from %s: %d since the last "
                           "such line (the last one: %s); give that client the orchestrator's "
                           "token (--token_file or $%s)", host, count, method, environment.TOKEN)


def server_credentials(cert_file: str, key_file: str) -> grpc.ServerCredentials:
    with open(cert_file, "rb") as f:
        cert = f.read()
    with open(key_file, "rb") as f:
        key = f.read()
    return grpc.ssl_server_credentials([(key, cert)])


def channel_credentials(ca_file: str | None) -> grpc.ChannelCredentials:
    """TLS credentials trusting ``ca_file`` (e.g. a self-signed server cert), else system roots."""
    root = None
    if ca_file:
        with open(ca_file, "rb") as f:
            root = f.read()
    return grpc.ssl_channel_credentials(root_certificates=root)
