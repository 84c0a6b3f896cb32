"""Errors of the membership service, shared by the server and the client.

The server raises a :class:`RendezvousError` with a gRPC status code, a short
machine-readable ``reason`` and a message that says what to do; it reaches
the client as the same subclass (:mod:`tensorflow_elastic.rpc`), so a worker
tells "the generation changed, re-join" from "the run failed, give up"
without parsing messages.
"""

from __future__ import annotations

import grpc

from tensorflow_elastic.rpc import ServiceError

BAD_REQUEST = "bad_request"
RUN_MISMATCH = "run_mismatch"
UNKNOWN_RUN = "unknown_run"
UNKNOWN_NODE = "unknown_node"
NOT_MEMBER = "not_member"
NODE_REMOVED = "node_removed"
NODE_REMOVED_MAY_RETURN = "node_removed_may_return"
STALE_GENERATION = "stale_generation"
RUN_FAILED = "run_failed"
JOB_COMPLETE = "job_complete"
TIMEOUT = "timeout"
BLOCKLISTED = "blocklisted"
LIMIT_REACHED = "limit_reached"
NOT_LEADER = "not_leader"
STORE_LIMIT = "store_limit"
UNREACHABLE = "unreachable"
# Trailing metadata of a NOT_LEADER refusal: HOST:PORT of the replica that leads ("" unknown).
LEADER_METADATA_KEY = "tfe-leader"


_CODES = {code.value[0]: code for code in grpc.StatusCode}


class RendezvousError(ServiceError):
    """A call the orchestrator refused or could not complete."""

    default_reason = BAD_REQUEST

    @classmethod
    def from_status(cls, code: grpc.StatusCode, message: str,
                    reason: str | None) -> "RendezvousError":
        if reason is None:
            return RendezvousError(message, code=code, reason="")
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return InvalidArgumentError(message, reason=reason)
        return _BY_REASON.get(reason, RendezvousError)(message, code=code, reason=reason)

    @classmethod
    def from_answer(cls, code: int, message: str, reason: str) -> "RendezvousError":
        """The error one entry of a batched reply carries (a KeepAlive or JoinMany answer):
        the status code's number, its message and the reason ("" for none)."""
        return cls.from_status(_CODES.get(code, grpc.StatusCode.UNKNOWN), message,
                               reason or None)


class InvalidArgumentError(RendezvousError):
    """The request itself is malformed; fix the caller."""

    default_code = grpc.StatusCode.INVALID_ARGUMENT


class GenerationChangedError(RendezvousError):
    """The caller's generation ended; re-join to get the new membership."""

    default_reason = STALE_GENERATION


class NodeRemovedError(RendezvousError):
    """The node was removed from the run (failure or leave); join as a new node, or, when
    :attr:`may_return`, join again with its id (it was only silent: its process lives on)."""

    default_reason = NODE_REMOVED

    @property
    def may_return(self) -> bool:
        return self.reason == NODE_REMOVED_MAY_RETURN


class RunFailedError(RendezvousError):
    """The run ended with an error; every member gets this and should stop."""

    default_reason = RUN_FAILED


class JobCompleteError(RendezvousError):
    """The job this run served is complete: a node that comes now has nothing to do and
    should exit successfully (the run is not started again for it)."""

    default_reason = JOB_COMPLETE


class RendezvousTimeoutError(RendezvousError):
    """A join, barrier or exchange did not complete in time; the message names who is missing."""

    default_code = grpc.StatusCode.DEADLINE_EXCEEDED
    default_reason = TIMEOUT


class BlocklistedError(RendezvousError):
    """The node's address failed repeatedly and is cooling down."""

    default_reason = BLOCKLISTED


class LimitReachedError(RendezvousError):
    """The orchestrator is at one of its limits (runs, watch streams, exchanges); the message
    names the limit. Retried by the client: runs expire and streams close."""

    default_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    default_reason = LIMIT_REACHED


class NotLeaderError(RendezvousError):
    """This orchestrator replica stands by; the client goes to the leading one. Retried."""

    default_code = grpc.StatusCode.UNAVAILABLE
    default_reason = NOT_LEADER


class StoreLimitError(RendezvousError):
    """The change cannot be saved: the store refused a request over its size limit (etcd's
    ``--max-request-bytes``). Not retried: the same change would be refused again; the
    replica still leads and its store still answers."""

    default_code = grpc.StatusCode.FAILED_PRECONDITION
    default_reason = STORE_LIMIT


class OrchestratorUnreachableError(RendezvousError):
    """No orchestrator replica answered for the client's whole retry time (raised by the
    client, never sent)."""

    default_code = grpc.StatusCode.UNAVAILABLE
    default_reason = UNREACHABLE


_BY_REASON: dict[str, type[RendezvousError]] = {
    STALE_GENERATION: GenerationChangedError,
    NODE_REMOVED: NodeRemovedError,
    NODE_REMOVED_MAY_RETURN: NodeRemovedError,
    RUN_FAILED: RunFailedError,
    JOB_COMPLETE: JobCompleteError,
    TIMEOUT: RendezvousTimeoutError,
    BLOCKLISTED: BlocklistedError,
    LIMIT_REACHED: LimitReachedError,
    NOT_LEADER: NotLeaderError,
    STORE_LIMIT: StoreLimitError,
}
