"""gRPC conventions shared by the orchestrator and the parameter server, client and service.

A service refuses a call with a :class:`ServiceError`: a status code, a short
machine-readable ``reason`` and a message that says what to do. The reason
travels in the trailing metadata key ``tfe-reason`` so that the client can
raise the same error class again: callers branch on the class or the reason,
never on the message. Clients call through :func:`call_with_retry`, so a
server that restarts, or sheds calls under load, is a pause, not an error.
"""

from __future__ import annotations

import random
import time
from typing import Callable, Collection, NoReturn, TypeVar

import grpc

REASON_METADATA_KEY = "tfe-reason"
FIRST_BACKOFF_S = 0.05
# Codes of a call that did not complete and may be sent again when it is idempotent: the server
# is unreachable (restarting, network blip) or shed the call under load.
UNREACHABLE_OR_SHED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
                       grpc.StatusCode.RESOURCE_EXHAUSTED)

T = TypeVar("T")
E = TypeVar("E", bound="ServiceError")


class ServiceError(Exception):
    """A call a service refused or could not complete; each service has its own subclasses."""

    default_code = grpc.StatusCode.FAILED_PRECONDITION
    default_reason = ""

    def __init__(self, message: str, code: grpc.StatusCode | None = None,
                 reason: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.reason = reason or self.default_reason

    @classmethod
    def from_status(cls: type[E], code: grpc.StatusCode, message: str, reason: str | None) -> E:
        """The error a client raises for a failed call (``reason`` None: the server sent none).

        A service with a class per reason overrides this to pick the class.
        """
        return cls(message, code=code, reason=reason)


def peer_host(peer: str) -> str:
    """The host of a gRPC peer ("ipv4:10.0.0.5:4242" -> "10.0.0.5", "ipv6:[::1]:4242" -> "::1")."""
    address = peer.split(":", 1)[1] if peer.startswith(("ipv4:", "ipv6:")) else peer
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return host.strip("[]")


def reason_metadata(error: ServiceError) -> tuple[tuple[str, str], ...]:
    """The trailing metadata that carries ``error``'s reason to the client."""
    return ((REASON_METADATA_KEY, error.reason),)


def abort(context: grpc.ServicerContext, error: ServiceError) -> NoReturn:
    """Ends the call of a thread-pool servicer with ``error`` (an asyncio servicer passes
    :func:`reason_metadata` to its ``context.abort`` instead)."""
    context.set_trailing_metadata(reason_metadata(error))
    context.abort(error.code, error.message)


def rebuild_error(e: grpc.RpcError, family: type[E]) -> E:
    """The ``family`` error for a failed call, of the class the service raised."""
    return family.from_status(e.code(), e.details() or str(e.code()), reason_of(e))


def reason_of(e: grpc.RpcError) -> str | None:
    """The reason a service sent with a failed call (None: it sent none)."""
    return dict(e.trailing_metadata() or ()).get(REASON_METADATA_KEY)


def call_with_retry(attempt: Callable[[], T], retry_on: Collection[grpc.StatusCode],
                    give_up_at: float, max_backoff: float,
                    retry_reasons: Collection[str] = (), patience: float | None = None) -> T:
    """``attempt()``, again while it fails with a code in ``retry_on`` (or a reason in
    ``retry_reasons``, e.g. a server asking to come back later) and the next try can start by
    ``give_up_at`` (monotonic) and, with ``patience``, within ``patience`` seconds of the first
    failure (a call that waited long on the server still gets a full ``patience`` when the
    server then vanishes). Raises the ``grpc.RpcError`` of the last attempt.

    Each pause is drawn at random up to a bound that doubles from :data:`FIRST_BACKOFF_S` to
    ``max_backoff`` ("full jitter"): clients that a server shed at the same moment come back
    spread out instead of shedding each other again.
    """
    bound = FIRST_BACKOFF_S
    failing = False
    while True:
        try:
            return attempt()
        except grpc.RpcError as e:
            pause = random.uniform(0.0, bound)
            retryable = (e.code() in retry_on
                         or bool(retry_reasons) and reason_of(e) in retry_reasons)
            if patience is not None and not failing:
                give_up_at = min(give_up_at, time.monotonic() + patience)
            failing = True
            if not retryable or time.monotonic() + pause > give_up_at:
                raise
        time.sleep(pause)
        bound = min(bound * 2, max_backoff)
