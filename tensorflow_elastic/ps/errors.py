"""Errors of the parameter server, shared by the service and the client.

The service refuses a request with a :class:`PSError` whose ``reason`` says
why; the client gets the same reason back (:mod:`tensorflow_elastic.rpc`), so
a worker can tell, e.g., a PS that went back to an older version from a bug.
"""

from __future__ import annotations

from tensorflow_elastic.rpc import ServiceError

WRONG_RUN = "wrong_run"
UNKNOWN_WORKER = "unknown_worker"
MALFORMED = "malformed"
WRONG_SHAPE = "wrong_shape"
FUTURE_VERSION = "future_version"
BAD_CONFIG = "bad_config"
BAD_ARGUMENT = "bad_argument"        # a number out of range: a non-finite wait or loss, samples
NON_FINITE = "non_finite"            # a gradient with NaN or Inf values
QUEUE_FULL = "queue_full"            # the gradient queue is at max_queued: retry after a pause
NOT_THE_WORKER = "not_the_worker"    # a worker id without the secret it was registered with
UNAUTHENTICATED = "unauthenticated"  # no or the wrong shared token
TOO_LARGE = "too_large"              # a message above the size the model needs


class PSError(ServiceError):
    """The parameter server refused a call or could not be reached in time."""

    def __str__(self) -> str:
        return ": ".join(part for part in (self.code.name, self.reason, self.message) if part)
