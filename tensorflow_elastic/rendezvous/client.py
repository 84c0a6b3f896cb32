"""The client of the orchestrator, used by agents and workers.

Every call has a deadline. A call that finds the orchestrator unreachable
(UNAVAILABLE: restarting, network blip) or that it shed under load (CANCELLED,
RESOURCE_EXHAUSTED) is retried with jittered exponential backoff for up to
``retry_timeout`` seconds, so an orchestrator killed and restarted with its
state directory, or swamped at start-up, is invisible to members beyond a
pause. Every call may be sent twice: joins carry a nonce and members their
permanent id, so retries never create a second node; a barrier or exchange is
named by generation and name; a repeated leave or failure report changes
nothing more.
Errors come back as the :mod:`~tensorflow_elastic.rendezvous.errors` classes.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any, Callable, Iterator

import grpc

from tensorflow_elastic import rpc
from tensorflow_elastic.proto import rendezvous_pb2 as pb
from tensorflow_elastic.proto import rendezvous_pb2_grpc as pb_grpc
from tensorflow_elastic.rendezvous import auth
from tensorflow_elastic.rendezvous.errors import RendezvousError
from tensorflow_elastic.rendezvous.types import (
    HeartbeatInfo, Membership, MembershipUpdate, NodeStatus, Phase, RunStatus)

logger = logging.getLogger(__name__)

# Extra time the transport deadline gets over a server-side wait, so the
# server's explanation (who is missing) arrives before the transport gives up.
_DEADLINE_MARGIN_S = 5.0
_BACKOFF_MAX_S = 2.0

# Watch streams end with these when the orchestrator restarts or sheds streams.
_RESUBSCRIBE = rpc.UNREACHABLE_OR_SHED
# A heartbeat that failed with these is simply sent again at the next interval.
_TRANSIENT = (*_RESUBSCRIBE, grpc.StatusCode.DEADLINE_EXCEEDED)

_CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]


def membership_from_proto(node_id: int | None, m: pb.Membership) -> Membership:
    return Membership(node_id, m.generation, dict(m.members), m.chief_id)


class Client:
    """Talks to one orchestrator on behalf of one node of run ``run_id``.

    After :meth:`join`, the client remembers the node's id and generation and
    sends them with every later call; calling :meth:`join` again re-joins (see
    docs/orchestrator.md: a member re-joining its current generation ends it).
    """

    def __init__(self, endpoint: str, run_id: str, token: str | None = None, *,
                 tls_ca: str | None = None, tls: bool = False, call_timeout: float = 10.0,
                 retry_timeout: float = 60.0):
        self.endpoint = endpoint
        self.run_id = run_id
        self.call_timeout = call_timeout
        self.retry_timeout = retry_timeout
        self._metadata = auth.metadata(token)
        if tls or tls_ca:
            self._channel = grpc.secure_channel(endpoint, auth.channel_credentials(tls_ca),
                                                options=_CHANNEL_OPTIONS)
        else:
            self._channel = grpc.insecure_channel(endpoint, options=_CHANNEL_OPTIONS)
        self._stub = pb_grpc.RendezvousStub(self._channel)
        self.node_id: int | None = None
        self.generation = 0
        self._join_args: tuple[str, int, int] | None = None
        self._heartbeats: _Heartbeats | None = None
        self._closed = False

    def close(self) -> None:
        self._closed = True
        self.stop_heartbeats()
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ calls

    def join(self, address: str | None = None, min_nodes: int | None = None,
             max_nodes: int | None = None, timeout: float = 600.0) -> Membership:
        """Blocks until this node is a member of a generation; returns it.

        The first call needs the node's address and the run's node bounds; a
        later call re-joins with the same ones and gets the next generation.
        """
        if address is not None:
            if min_nodes is None or max_nodes is None:
                raise ValueError("join needs min_nodes and max_nodes along with the address")
            self._join_args = (address, min_nodes, max_nodes)
        if self._join_args is None:
            raise ValueError("the first join needs address, min_nodes and max_nodes")
        address, min_nodes, max_nodes = self._join_args
        nonce = uuid.uuid4().hex
        deadline = time.monotonic() + timeout

        def request() -> pb.JoinRequest:
            req = pb.JoinRequest(run_id=self.run_id, address=address, min_nodes=min_nodes,
                                 max_nodes=max_nodes, last_generation=self.generation,
                                 nonce=nonce, timeout_s=_remaining(deadline))
            if self.node_id is not None:
                req.node_id = self.node_id
            return req

        response = self._call(self._stub.Join, request, deadline)
        self.node_id = response.node_id
        self.generation = response.membership.generation
        return membership_from_proto(self.node_id, response.membership)

    def register(self, address: str, min_nodes: int, max_nodes: int) -> int:
        """Gets this node's permanent id without joining yet; returns at once.

        A node arriving while the run trains registers, builds its model and
        traces its functions, then calls :meth:`join`; until then the members
        do not count it as waiting, so they never stall for its warm-up.
        """
        self._join_args = (address, min_nodes, max_nodes)
        nonce = uuid.uuid4().hex
        response = self._call(self._stub.Join, lambda: pb.JoinRequest(
            run_id=self.run_id, address=address, min_nodes=min_nodes, max_nodes=max_nodes,
            nonce=nonce, timeout_s=self.call_timeout, register_only=True))
        self.node_id = response.node_id
        return self.node_id

    def heartbeat(self) -> HeartbeatInfo:
        """Renews liveness; says whether nodes wait to join or members were removed."""
        r = self._call(self._stub.Heartbeat, lambda: pb.HeartbeatRequest(
            run_id=self.run_id, node_id=self._id(), generation=self.generation))
        return HeartbeatInfo(r.generation, Phase(pb.RunState.Name(r.state)), r.waiting, r.removed,
                             r.member, r.queued)

    def watch(self) -> Iterator[MembershipUpdate]:
        """Yields the membership now and after every change; subscribes again when the
        stream breaks (orchestrator restart); ends when the run fails (the last update says
        why) or the client is closed."""
        request = pb.WatchRequest(run_id=self.run_id)
        if self.node_id is not None:
            request.node_id = self.node_id
        # A watch starts with the current state, so subscribing again loses nothing.
        while not self._closed:
            try:
                stream = self._call(lambda req, **kw: _first(self._stub.Watch(req, **kw)),
                                    lambda: request, timeout=None)
            except RendezvousError as e:
                if self._closed or e.code == grpc.StatusCode.CANCELLED:
                    continue
                raise
            try:
                for update in stream:
                    state = Phase(pb.RunState.Name(update.state))
                    yield MembershipUpdate(membership_from_proto(None, update.membership), state,
                                           update.waiting, update.reason)
                    if state.ended:
                        return  # nothing more will change
            except grpc.RpcError as e:
                if not self._closed and e.code() not in _RESUBSCRIBE:
                    raise rpc.rebuild_error(e, RendezvousError) from None
            finally:
                stream.cancel()
            time.sleep(rpc.FIRST_BACKOFF_S)

    def report_failure(self, peers: list[int], reason: str = "") -> tuple[list[int], list[int]]:
        """Reports unreachable peers; returns (confirmed failed and removed, still alive)."""
        r = self._call(self._stub.ReportFailure, lambda: pb.ReportFailureRequest(
            run_id=self.run_id, node_id=self._id(), generation=self.generation,
            peers=peers, reason=reason), timeout=self.call_timeout + 2 * len(peers))
        return list(r.confirmed), list(r.alive)

    def report_death(self, node_id: int, reason: str = "") -> None:
        """Tells the orchestrator that node ``node_id``'s process has died (its agent saw it)."""
        self._call(self._stub.ReportFailure, lambda: pb.ReportFailureRequest(
            run_id=self.run_id, node_id=node_id, peers=[node_id], reason=reason))

    def barrier(self, name: str, timeout: float = 60.0) -> None:
        """Returns once every member of this node's generation has entered ``name``."""
        deadline = time.monotonic() + timeout
        self._call(self._stub.Barrier, lambda: pb.BarrierRequest(
            run_id=self.run_id, node_id=self._id(), generation=self.generation, name=name,
            timeout_s=_remaining(deadline)), deadline)

    def synchronize(self, key: str, value: bytes, timeout: float = 60.0) -> dict[int, bytes]:
        """Puts this node's ``value`` under ``key``; returns every member's value by node id."""
        deadline = time.monotonic() + timeout
        r = self._call(self._stub.Synchronize, lambda: pb.SynchronizeRequest(
            run_id=self.run_id, node_id=self._id(), generation=self.generation, key=key,
            value=value, timeout_s=_remaining(deadline)), deadline)
        return dict(r.values)

    def leave(self, reason: str = "") -> None:
        """Leaves the run for good (e.g. on a preemption notice)."""
        self.stop_heartbeats()
        self._call(self._stub.Leave, lambda: pb.LeaveRequest(
            run_id=self.run_id, node_id=self._id(), reason=reason))

    def status(self, all_runs: bool = False) -> list[RunStatus]:
        """This run's status (or every run's) with members, waiting nodes and history."""
        r = self._call(self._stub.Status, lambda: pb.StatusRequest(
            run_id="" if all_runs else self.run_id))
        return [_run_status(s) for s in r.runs]

    # ------------------------------------------------------------ heartbeats

    def start_heartbeats(self, interval: float = 1.0,
                         on_reply: Callable[[HeartbeatInfo], None] | None = None,
                         on_stop: Callable[[Exception], None] | None = None) -> None:
        """Heartbeats every ``interval`` seconds in a daemon thread until :meth:`stop_heartbeats`.

        ``on_reply`` sees every reply. :attr:`heartbeat_error` holds the error
        of the last heartbeat (None after a success); transient ones
        (unreachable, cancelled, late) are retried at the next interval, others
        (node removed, run failed, a bug) end the thread, and ``on_stop`` hears why.
        """
        self.stop_heartbeats()
        self._heartbeats = _Heartbeats(self, interval, on_reply, on_stop)

    def stop_heartbeats(self) -> None:
        if self._heartbeats is not None:
            self._heartbeats.stop()

    @property
    def heartbeat_error(self) -> Exception | None:
        return None if self._heartbeats is None else self._heartbeats.error

    # -------------------------------------------------------------- internals

    def _id(self) -> int:
        if self.node_id is None:
            raise RendezvousError("this client has not joined yet; call join() first")
        return self.node_id

    def _call(self, method: Callable[..., Any], request: Callable[[], Any],
              deadline: float | None = None, timeout: float | None = -1.0) -> Any:
        """Calls ``method``, retrying while the orchestrator is unreachable or sheds the call.

        ``deadline`` (monotonic) bounds server-side waits; otherwise each attempt
        gets ``timeout`` (default: call_timeout; None: no deadline, for streams).
        """
        give_up = time.monotonic() + self.retry_timeout
        if deadline is not None:
            give_up = max(give_up, deadline)

        def attempt() -> Any:
            if deadline is not None:
                attempt_timeout = _remaining(deadline) + _DEADLINE_MARGIN_S
            else:
                attempt_timeout = self.call_timeout if timeout == -1.0 else timeout
            return method(request(), timeout=attempt_timeout, metadata=self._metadata)

        try:
            return rpc.call_with_retry(attempt, rpc.UNREACHABLE_OR_SHED, give_up, _BACKOFF_MAX_S)
        except grpc.RpcError as e:
            raise rpc.rebuild_error(e, RendezvousError) from None


class _Heartbeats:
    def __init__(self, client: Client, interval: float,
                 on_reply: Callable[[HeartbeatInfo], None] | None,
                 on_stop: Callable[[Exception], None] | None):
        self._client = client
        self._interval = interval
        self._on_reply = on_reply
        self._on_stop = on_stop
        self._stop = threading.Event()
        self.error: Exception | None = None
        self._thread = threading.Thread(target=self._loop, name="tfelastic-heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            self._beat()
        except Exception as e:  # noqa: BLE001 - the owner must hear why its heartbeats ended
            self.error = e
            if self._on_stop is not None and isinstance(e, RendezvousError):
                self._on_stop(e)  # the orchestrator's answer (removed, run failed): its owner says why
                return
            logger.exception("heartbeats to the orchestrator stopped")
            if self._on_stop is not None:
                self._on_stop(e)

    def _beat(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                info = self._client.heartbeat()
            except RendezvousError as e:
                self.error = e  # kept for the owner
                if e.code in _TRANSIENT:
                    continue
                raise  # removed, run failed, ...: more heartbeats cannot help
            self.error = None
            if self._on_reply is not None:
                try:
                    self._on_reply(info)
                except Exception:  # noqa: BLE001 - a listener's bug must not silence the node
                    logger.exception("heartbeat listener failed; heartbeats go on")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()


def _first(stream: Any) -> Any:
    """Waits for a stream's first message so that connection errors surface (and are
    retried) at the call; returns an iterator over all messages."""
    first = next(stream)

    class _Stream:
        def __iter__(self) -> Iterator[Any]:
            yield first
            yield from stream

        def cancel(self) -> None:
            stream.cancel()

    return _Stream()


def _remaining(deadline: float) -> float:
    return max(0.001, deadline - time.monotonic())


def _run_status(s: pb.RunStatus) -> RunStatus:
    return RunStatus(
        s.run_id, s.min_nodes, s.max_nodes, Phase(pb.RunState.Name(s.state)), s.reason,
        membership_from_proto(None, s.membership),
        [NodeStatus(n.node_id, n.address, n.role, n.silent_s) for n in s.nodes],
        [{"time": h.time, "event": h.event, "generation": h.generation, "nodes": list(h.nodes),
          "detail": h.detail} for h in s.history],
        [(b.address, b.failures, b.remaining_s) for b in s.blocklist])
