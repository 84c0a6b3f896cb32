"""The PS's shared token and TLS, by the orchestrator's conventions (:mod:`..rendezvous.auth`).

With a token, every call must carry ``authorization: Bearer <token>`` (what
:func:`auth.metadata` sends); any other call is refused with
UNAUTHENTICATED before its request is parsed, counted and logged at a
bounded rate. The PS serves with gRPC's thread-pool server, so the check is
a synchronous interceptor; the header and its format come from
:mod:`~tensorflow_elastic.rendezvous.auth`, as do the token file and the
TLS credentials.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import grpc

from tensorflow_elastic import rpc
from tensorflow_elastic.ps.errors import UNAUTHENTICATED, PSError
from tensorflow_elastic.ps.refusals import Refusals
from tensorflow_elastic.rendezvous import auth

_REFUSAL = PSError("missing or wrong token: pass the parameter server's shared token (token= or "
                   "$TFE_RDZV_TOKEN)", grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED)


def _refuse(request: bytes, context: grpc.ServicerContext) -> None:
    rpc.abort(context, _REFUSAL)


# Raw bytes in and nothing out: the call is refused before its request is parsed.
_REJECT = grpc.unary_unary_rpc_method_handler(_refuse)


class TokenGate(grpc.ServerInterceptor):
    """Lets through only calls that carry ``token``, compared in constant time."""

    def __init__(self, token: str, refusals: Refusals):
        self._check = auth.TokenCheck(token)
        self._refusals = refusals

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        if self._check.admits(handler_call_details):
            return continuation(handler_call_details)
        self._refusals.record(UNAUTHENTICATED, f"{handler_call_details.method} without the "
                                               f"right token")
        return _REJECT


def add_port(server: grpc.Server, address: str, tls_cert_file: str | None,
             tls_key_file: str | None) -> int:
    """Listens on ``address``, with TLS when both files are given; the bound port (0: failed)."""
    if bool(tls_cert_file) != bool(tls_key_file):
        raise ValueError("TLS needs both tls_cert_file and tls_key_file (PEM); give both or "
                         "neither")
    if tls_cert_file:
        return server.add_secure_port(address, auth.server_credentials(tls_cert_file,
                                                                       tls_key_file))
    return server.add_insecure_port(address)


def open_channel(address: str, options: Sequence[tuple[str, Any]],
                 tls_ca_file: str | None) -> grpc.Channel:
    """A channel to the PS: TLS trusting ``tls_ca_file`` when given, else plaintext."""
    if tls_ca_file:
        return grpc.secure_channel(address, auth.channel_credentials(tls_ca_file),
                                   options=options)
    return grpc.insecure_channel(address, options=options)
