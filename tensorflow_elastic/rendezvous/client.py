"""The client of the orchestrator, used by agents and workers.

Every call has a deadline. A call that finds the orchestrator unreachable
(UNAVAILABLE: restarting, network blip) or that it shed under load (CANCELLED,
RESOURCE_EXHAUSTED) is retried with jittered exponential backoff for up to
``retry_timeout`` seconds of failures in a row, so an orchestrator killed and
restarted with its state directory, or swamped at start-up, is invisible to
members beyond a pause. The endpoint may list replicas (``h1:p1,h2:p2``): a
call goes to the one that leads (a standby names it), and to the next one
when the current one does not answer, so a failover is a pause too; watch
streams subscribe again at the new leader. Only a listed replica is followed:
the leader's name comes from etcd, and whoever can write there must not be
able to send nodes (and their token) elsewhere. Every call may be sent twice:
joins carry a nonce and members their permanent id, so retries never create a
second node; a barrier or exchange is named by generation and name; a repeated
leave or failure report changes nothing more.
Joins and watches name the member map the client holds, so the orchestrator may
answer with what changed since (member_deltas.py); a delta that does not check
out is asked for again as the whole map.
Errors come back as the :mod:`~tensorflow_elastic.rendezvous.errors` classes.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Sequence

import grpc

from tensorflow_elastic import rpc
from tensorflow_elastic.proto import rendezvous_pb2 as pb
from tensorflow_elastic.proto import rendezvous_pb2_grpc as pb_grpc
from tensorflow_elastic.rendezvous import auth, keepalive, member_deltas
from tensorflow_elastic.rendezvous.errors import (
    LEADER_METADATA_KEY, NOT_LEADER, OrchestratorUnreachableError, RendezvousError)
from tensorflow_elastic.rendezvous.keepalive import KeepAliveStream
from tensorflow_elastic.rendezvous.member_deltas import DeltaMismatch, MapVersion
from tensorflow_elastic.rendezvous.packed_maps import members_of
from tensorflow_elastic.rendezvous.settings import (
    CLIENT_RECONNECT_BACKOFF_MAX_S, CLIENT_RETRY_BACKOFF_MAX_S, MAX_JOINS_PER_CALL)
from tensorflow_elastic.rendezvous.types import (
    HeartbeatInfo, Membership, MembershipUpdate, NodeStatus, Phase, RunStatus)

logger = logging.getLogger(__name__)

# Extra time the transport deadline gets over a server-side wait, so the
# server's explanation (who is missing) arrives before the transport gives up.
_DEADLINE_MARGIN_S = 5.0
# With replicas, a call that finds none leading is most likely in a failover: try sooner.
_FAILOVER_BACKOFF_MAX_S = 0.5

# Watch streams end with these when the orchestrator restarts or sheds streams.
_RESUBSCRIBE = rpc.UNREACHABLE_OR_SHED

_CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    # gRPC's default reconnect backoff grows to minutes: a client would find an orchestrator
    # that restarted after a 10 s outage only seconds later, after its run gave up on it.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", int(CLIENT_RECONNECT_BACKOFF_MAX_S * 1000)),
]


# A member map the client holds, and its version.
HeldMap = tuple[MapVersion, dict[int, str]]


def membership_from_proto(node_id: int | None, m: pb.Membership,
                          taken_back_after: str = "") -> Membership:
    return Membership(node_id, m.generation, members_of(m), m.chief_id, taken_back_after)


def read_membership(node_id: int | None, m: pb.Membership, held: HeldMap | None,
                    taken_back_after: str = "") -> tuple[Membership, HeldMap]:
    """The membership ``m`` carries, whole or as a delta against ``held`` (the map the request
    named), and the map now held; DeltaMismatch when the delta does not apply to it."""
    if not m.delta:
        members = members_of(m)
    elif held is None or held[0] != MapVersion(m.base.generation, m.base.digest):
        raise DeltaMismatch(f"a delta against generation {m.base.generation}, which this "
                            f"client did not name")
    else:
        members = member_deltas.apply(held[1], held[0].digest, member_deltas.Delta(
            members_of(m), list(m.removed)), m.digest)
    return (Membership(node_id, m.generation, members, m.chief_id, taken_back_after),
            (MapVersion(m.generation, m.digest), members))


def _name_map(request: pb.JoinRequest | pb.WatchRequest, held: HeldMap | None) -> None:
    if held is not None:
        request.known_map.generation = held[0].generation
        request.known_map.digest = held[0].digest


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
        self._credentials = auth.channel_credentials(tls_ca) if tls or tls_ca else None
        # What a client with the same channel needs: its heartbeat stream may be shared.
        self._channel_args = dict(token=token, tls_ca=tls_ca, tls=tls, call_timeout=call_timeout,
                                  retry_timeout=retry_timeout)
        self._replicas: list[_Replica] = []
        # Leaders named by a replica that are not listed (warned about once each).
        self._refused_leaders: set[str] = set()
        self._lock = threading.Lock()
        for address in split_endpoints(endpoint):
            if self._listed(address) is None:
                self._replica(address)
        # The replica calls go to first: the one that answered last.
        self._current = 0
        self.node_id: int | None = None
        self.generation = 0
        self._join_args: tuple[str, int, int] | None = None
        self._heartbeats: _Heartbeats | None = None
        # The last member map a join or watch got: the next ones may get a delta against it.
        self._held: HeldMap | None = None
        # The shortest heartbeat interval the orchestrator asked for in the last join reply.
        self.beat_interval_floor = 0.0
        self._closed = False

    def close(self) -> None:
        """Ends heartbeats and watches: closing the channels first cuts a call in flight short."""
        self._closed = True
        if self._heartbeats is not None:
            self._heartbeats.stop(wait=False)
        for replica in self._replicas:
            replica.channel.close()
        self.stop_heartbeats()

    @property
    def current_endpoint(self) -> str:
        """The replica this client talks to now (the leader, as far as it knows)."""
        return self._replicas[self._current].address

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ calls

    def join(self, address: str | None = None, min_nodes: int | None = None,
             max_nodes: int | None = None, timeout: float = 600.0, *,
             with_members: bool = True) -> Membership:
        """Blocks until this node is a member of a generation; returns it.

        The first call needs the node's address and the run's node bounds; a
        later call re-joins with the same ones and gets the next generation.
        ``with_members=False``: the membership comes without its member map (empty
        ``members``), for a node whose process reads the map from another of its nodes (an
        agent's workers): a formation of N nodes then sends the map once per process.
        """
        if address is not None:
            if min_nodes is None or max_nodes is None:
                raise ValueError("join needs min_nodes and max_nodes along with the address")
            self.bind(address, min_nodes, max_nodes)
        if self._join_args is None:
            raise ValueError("the first join needs address, min_nodes and max_nodes")
        return self._join(uuid.uuid4().hex, time.monotonic() + timeout, with_members)

    def bind(self, address: str, min_nodes: int, max_nodes: int) -> None:
        """Sets what a first :meth:`join` takes (the node's address, the run's node bounds)
        without joining, for a node that joins together with others (:func:`join_together`)."""
        self._join_args = (address, min_nodes, max_nodes)

    def _join_request(self, nonce: str, deadline: float, held: HeldMap | None,
                      with_members: bool) -> pb.JoinRequest:
        address, min_nodes, max_nodes = self._join_args
        req = pb.JoinRequest(run_id=self.run_id, address=address, min_nodes=min_nodes,
                             max_nodes=max_nodes, last_generation=self.generation,
                             nonce=nonce, timeout_s=_remaining(deadline), packed_maps=True)
        if self.node_id is not None:
            req.node_id = self.node_id
        _name_map(req, held)
        req.omit_members = not with_members
        return req

    def _join(self, nonce: str, deadline: float, with_members: bool,
              answered: tuple[HeldMap | None, pb.JoinResponse] | None = None) -> Membership:
        """Joins with ``nonce``; ``answered``: the map named and the reply of a first try sent
        another way (an entry of :func:`join_together`'s call)."""
        # A join again after a bad delta, naming no map, gets the whole one: the node is a
        # member of a generation newer than last_generation by now, so it returns at once.
        for held, response in (answered or (self._held, None), (None, None)):
            if response is None:
                response = self._call(lambda stub: stub.Join, lambda: self._join_request(
                    nonce, deadline, held, with_members), deadline)
            try:
                membership, now_held = read_membership(
                    response.node_id, response.membership, held, response.taken_back_after)
            except DeltaMismatch as e:
                logger.warning("the member map of a join reply did not check out (%s); "
                               "asking for the whole map", e)
                continue
            sent = response.membership
            if with_members or sent.members or sent.packed_members or sent.delta:
                self._held = now_held  # (an orchestrator may send the map all the same)
            self.node_id = response.node_id
            self.generation = response.membership.generation
            self.beat_interval_floor = response.heartbeat_interval_s
            return membership
        raise RendezvousError("the orchestrator sent a delta of the member map to a join "
                              "that named no map")

    def follow(self, membership: Membership) -> None:
        """This node is a member of ``membership``, which its watch delivered (no join): its
        calls (heartbeats, barriers, reports) now name that generation."""
        if membership.node_id != self.node_id or membership.node_id not in membership.members:
            raise ValueError(f"node {self.node_id} is not a member of generation "
                             f"{membership.generation}")
        self.generation = membership.generation

    def register(self, address: str, min_nodes: int, max_nodes: int) -> int:
        """Gets this node's permanent id without joining yet; returns at once.

        A node arriving while the run trains registers, builds its model and
        traces its functions, then calls :meth:`join`; until then the members
        do not count it as waiting, so they never stall for its warm-up.
        """
        self._join_args = (address, min_nodes, max_nodes)
        nonce = uuid.uuid4().hex
        response = self._call(lambda stub: stub.Join, lambda: pb.JoinRequest(
            run_id=self.run_id, address=address, min_nodes=min_nodes, max_nodes=max_nodes,
            nonce=nonce, timeout_s=self.call_timeout, register_only=True, packed_maps=True))
        self.node_id = response.node_id
        return self.node_id

    def heartbeat(self) -> HeartbeatInfo:
        """Renews liveness; says whether nodes wait to join or members were removed."""
        return keepalive.info_from_proto(self._call(
            lambda stub: stub.Heartbeat, lambda: pb.HeartbeatRequest(
                run_id=self.run_id, node_id=self._id(), generation=self.generation)))

    def watch(self) -> Iterator[MembershipUpdate]:
        """Yields the membership now and after every change; subscribes again when the
        stream breaks (orchestrator restart); ends when the run fails (the last update says
        why) or the client is closed."""
        # A watch starts with the current state, so subscribing again loses nothing.
        named = True  # naming the map held; not after a delta that did not check out
        while not self._closed:
            request = pb.WatchRequest(run_id=self.run_id, packed_maps=True)
            if self.node_id is not None:
                request.node_id = self.node_id
            held = self._held if named else None
            _name_map(request, held)
            named = True
            try:
                stream = self._call(lambda stub: lambda req, **kw: _first(stub.Watch(req, **kw)),
                                    lambda: request, timeout=None)
            except RendezvousError as e:
                if self._closed or e.code == grpc.StatusCode.CANCELLED:
                    continue
                raise
            try:
                for update in stream:
                    state = Phase(pb.RunState.Name(update.state))
                    membership, held = read_membership(None, update.membership, held)
                    if self._held is None or held[0].generation >= self._held[0].generation:
                        self._held = held
                    yield MembershipUpdate(membership, state, update.waiting, update.reason)
                    if state.ended:
                        return  # nothing more will change
            except DeltaMismatch as e:
                logger.warning("a watch update's member map did not check out (%s); "
                               "subscribing again for the whole map", e)
                named = False
            except grpc.RpcError as e:
                if not self._closed and e.code() not in _RESUBSCRIBE:
                    raise rpc.rebuild_error(e, RendezvousError) from None
            finally:
                stream.cancel()
            time.sleep(rpc.FIRST_BACKOFF_S)

    def report_failure(self, peers: list[int], reason: str = "") -> tuple[list[int], list[int]]:
        """Reports unreachable peers; returns (confirmed failed and removed, still alive)."""
        r = self._call(lambda stub: stub.ReportFailure, lambda: pb.ReportFailureRequest(
            run_id=self.run_id, node_id=self._id(), generation=self.generation,
            peers=peers, reason=reason), timeout=self.call_timeout + 2 * len(peers))
        return list(r.confirmed), list(r.alive)

    def report_death(self, node_id: int, reason: str = "") -> None:
        """Tells the orchestrator that node ``node_id``'s process has died (its agent saw it)."""
        self._call(lambda stub: stub.ReportFailure, lambda: pb.ReportFailureRequest(
            run_id=self.run_id, node_id=node_id, peers=[node_id], reason=reason))

    def barrier(self, name: str, timeout: float = 60.0) -> None:
        """Returns once every member of this node's generation has entered ``name``."""
        deadline = time.monotonic() + timeout
        self._call(lambda stub: stub.Barrier, lambda: pb.BarrierRequest(
            run_id=self.run_id, node_id=self._id(), generation=self.generation, name=name,
            timeout_s=_remaining(deadline)), deadline)

    def synchronize(self, key: str, value: bytes, timeout: float = 60.0) -> dict[int, bytes]:
        """Puts this node's ``value`` under ``key``; returns every member's value by node id."""
        deadline = time.monotonic() + timeout
        r = self._call(lambda stub: stub.Synchronize, lambda: pb.SynchronizeRequest(
            run_id=self.run_id, node_id=self._id(), generation=self.generation, key=key,
            value=value, timeout_s=_remaining(deadline)), deadline)
        return dict(r.values)

    def leave(self, reason: str = "", job_finished: bool = False) -> None:
        """Leaves the run for good (e.g. on a preemption notice); ``job_finished``: after
        training finished (the exit barrier passed), which ends the job for the nodes still
        waiting to join."""
        self.stop_heartbeats()
        self._call(lambda stub: stub.Leave, lambda: pb.LeaveRequest(
            run_id=self.run_id, node_id=self._id(), reason=reason, job_finished=job_finished))

    def status(self, all_runs: bool = False) -> list[RunStatus]:
        """This run's status (or every run's) with members, waiting nodes and history."""
        r = self._call(lambda stub: stub.Status, lambda: pb.StatusRequest(
            run_id="" if all_runs else self.run_id))
        return [_run_status(s) for s in r.runs]

    # ------------------------------------------------------------ heartbeats

    def start_heartbeats(self, interval: float = 1.0,
                         on_reply: Callable[[HeartbeatInfo], None] | None = None,
                         on_stop: Callable[[Exception], None] | None = None) -> None:
        """Heartbeats every ``interval`` seconds until :meth:`stop_heartbeats`, on the heartbeat
        stream this process keeps to the orchestrator (see keepalive.py), or with unary calls in
        a daemon thread where the orchestrator has no such stream. A large run's orchestrator
        asks for a longer interval in its join replies (:attr:`beat_interval_floor`): then
        that one.

        ``on_reply`` sees every reply. :attr:`heartbeat_error` holds the error
        of the last heartbeat (None after a success); transient ones
        (unreachable, cancelled, late) are retried at the next interval, others
        (node removed, run failed, a bug) end the thread, and ``on_stop`` hears why.
        """
        self.stop_heartbeats()
        self._heartbeats = _Heartbeats(self, max(interval, self.beat_interval_floor), on_reply,
                                       on_stop)

    def stop_heartbeats(self) -> None:
        if self._heartbeats is not None:
            self._heartbeats.stop()

    @property
    def heartbeat_error(self) -> Exception | None:
        return None if self._heartbeats is None else self._heartbeats.error

    def _keepalive_stream(self, interval: float, on_idle: Callable[[KeepAliveStream], None],
                          first: keepalive.Beat) -> KeepAliveStream:
        """A heartbeat stream of this process, on a channel of its own (it outlives clients)."""
        owner = Client(self.endpoint, self.run_id, **self._channel_args)

        def ended(stream: KeepAliveStream) -> None:
            on_idle(stream)
            owner.close()

        return KeepAliveStream(
            lambda requests: owner._call(
                lambda stub: lambda req, **kw: _first(stub.KeepAlive(req, **kw)), requests,
                timeout=None),
            interval, self.call_timeout, ended, first)

    def _stream_key(self, interval: float) -> tuple:
        return (self.endpoint, interval, *sorted(self._channel_args.items()))

    # -------------------------------------------------------------- internals

    def _id(self) -> int:
        if self.node_id is None:
            raise RendezvousError("this client has not joined yet; call join() first")
        return self.node_id

    def _call(self, method: Callable[[pb_grpc.RendezvousStub], Callable[..., Any]],
              request: Callable[[], Any], deadline: float | None = None,
              timeout: float | None = -1.0) -> Any:
        """Calls ``method(stub)`` of the replica that leads, retrying while no replica answers
        or one sheds the call, for up to ``retry_timeout`` seconds of failures in a row.

        ``deadline`` (monotonic) bounds server-side waits; otherwise each attempt
        gets ``timeout`` (default: call_timeout; None: no deadline, for streams).
        A replica that stands by names the leader, and the next attempt goes there;
        an unreachable one sends the next attempt to the next replica of the list.
        """
        give_up = time.monotonic() + self.retry_timeout
        if deadline is not None:
            give_up = max(give_up, deadline)

        def attempt() -> Any:
            if deadline is not None:
                attempt_timeout = _remaining(deadline) + _DEADLINE_MARGIN_S
            else:
                attempt_timeout = self.call_timeout if timeout == -1.0 else timeout
            index = self._current
            try:
                return method(self._replicas[index].stub)(
                    request(), timeout=attempt_timeout, metadata=self._metadata)
            except grpc.RpcError as e:
                self._move_on(index, e)
                raise

        try:
            return rpc.call_with_retry(
                attempt, rpc.UNREACHABLE_OR_SHED, give_up,
                (_FAILOVER_BACKOFF_MAX_S if len(self._replicas) > 1
                 else CLIENT_RETRY_BACKOFF_MAX_S),
                patience=self.retry_timeout)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNAVAILABLE and rpc.reason_of(e) in (None, NOT_LEADER):
                raise OrchestratorUnreachableError(
                    f"no orchestrator at {self.endpoint} led the run for {self.retry_timeout:g} "
                    f"s ({e.details()}); start it again (its --state_dir or --store keeps the "
                    f"run) or check --rdzv_endpoint") from None
            raise rpc.rebuild_error(e, RendezvousError) from None

    def _move_on(self, index: int, e: grpc.RpcError) -> None:
        """After a failed call to replica ``index``: on to the leader it named, or to the next
        replica when it did not answer."""
        with self._lock:
            if self._current != index:
                return  # another thread moved already
            if rpc.reason_of(e) == NOT_LEADER:
                leader = dict(e.trailing_metadata() or ()).get(LEADER_METADATA_KEY, "")
                listed = self._listed(leader)
                if listed is not None:
                    self._current = listed
                    return
                if leader and leader not in self._refused_leaders:
                    self._refused_leaders.add(leader)
                    logger.warning("the orchestrator replica at %s names %s as the leader, "
                                   "which is not one of %s: not following it",
                                   self._replicas[index].address, leader, self.endpoint)
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                self._current = (index + 1) % len(self._replicas)

    def _listed(self, address: str) -> int | None:
        """The index of the listed replica at ``address`` (None: not one of them)."""
        return next((index for index, replica in enumerate(self._replicas)
                     if replica.address == address), None)

    def _replica(self, address: str) -> None:
        """Adds a channel to the replica at ``address``."""
        if self._credentials is not None:
            channel = grpc.secure_channel(address, self._credentials, options=_CHANNEL_OPTIONS)
        else:
            channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
        self._replicas.append(_Replica(address, channel, pb_grpc.RendezvousStub(channel)))


@dataclasses.dataclass
class _Replica:
    address: str
    channel: grpc.Channel
    stub: pb_grpc.RendezvousStub


def join_together(clients: Sequence[Client], timeout: float = 600.0
                  ) -> list[Membership | RendezvousError]:
    """Joins the nodes of ``clients`` (each joined before, or bound: :meth:`Client.bind`) in
    one call on the first client's connection, as an agent joins the nodes of its workers; a
    formation then costs the orchestrator one call per launcher, not one per node. Each node is
    a join of its own (its nonce, so a retried call keeps its ids); only the first one's
    membership carries the member map, the others' its name alone. Returns each node's
    membership, or the error its join met, in ``clients``' order. An orchestrator without the
    batched call gets one join per node, each from a thread of its own."""
    if any(c._join_args is None for c in clients):
        raise ValueError("every client must have joined before or be bound (Client.bind)")
    if len({c.endpoint for c in clients}) > 1:
        raise ValueError("nodes that join together talk to one orchestrator: give their "
                         "clients the same endpoint")
    results: list[Membership | RendezvousError] = []
    for start in range(0, len(clients), MAX_JOINS_PER_CALL):
        results += _join_batch(clients[start:start + MAX_JOINS_PER_CALL], timeout)
    return results


def _join_batch(clients: Sequence[Client], timeout: float) -> list[Membership | RendezvousError]:
    deadline = time.monotonic() + timeout
    nonces = [uuid.uuid4().hex for _ in clients]
    held = [c._held for c in clients]

    def request() -> pb.JoinManyRequest:
        return pb.JoinManyRequest(joins=[
            c._join_request(nonce, deadline, h, with_members=k == 0)
            for k, (c, nonce, h) in enumerate(zip(clients, nonces, held))])

    try:
        response = clients[0]._call(lambda stub: stub.JoinMany, request, deadline)
    except RendezvousError as e:
        if e.code != grpc.StatusCode.UNIMPLEMENTED:
            raise
        with ThreadPoolExecutor(len(clients)) as pool:
            return list(pool.map(lambda k: _join_alone(clients[k], nonces[k], deadline, k == 0),
                                 range(len(clients))))
    if len(response.answers) != len(clients):
        raise RendezvousError(f"the orchestrator answered {len(response.answers)} of the "
                              f"{len(clients)} joins of a JoinMany call (one answer per join is "
                              f"its protocol): run an orchestrator of this package's version")
    results: list[Membership | RendezvousError] = []
    for k, (client, answer) in enumerate(zip(clients, response.answers)):
        if answer.HasField("reply"):
            results.append(client._join(nonces[k], deadline, k == 0, (held[k], answer.reply)))
        else:
            results.append(RendezvousError.from_answer(answer.code, answer.message,
                                                       answer.reason))
    return results


def _join_alone(client: Client, nonce: str, deadline: float,
                with_members: bool) -> Membership | RendezvousError:
    try:
        return client._join(nonce, deadline, with_members)
    except RendezvousError as e:
        return e


def split_endpoints(endpoint: str) -> list[str]:
    """``h1:p1,h2:p2`` -> its replicas' addresses; ValueError for an empty list."""
    addresses = [a.strip() for a in endpoint.split(",") if a.strip()]
    if not addresses:
        raise ValueError(f"no orchestrator address in {endpoint!r}; give HOST:PORT[,HOST:PORT]")
    return addresses


class _Heartbeats:
    """A node's heartbeats: a beat on the process's stream, or unary calls in a thread of their
    own (a node without an id yet, an orchestrator without the stream)."""

    def __init__(self, client: Client, interval: float,
                 on_reply: Callable[[HeartbeatInfo], None] | None,
                 on_stop: Callable[[Exception], None] | None):
        self._client = client
        self._interval = interval
        self._on_reply = on_reply
        self._on_stop = on_stop
        self._stop = threading.Event()
        self._error: Exception | None = None
        self._thread: threading.Thread | None = None
        self._beat: keepalive.Beat | None = None
        self._stream: KeepAliveStream | None = None
        if client.node_id is None:
            self._start_unary()
            return
        self._beat = keepalive.Beat(client.run_id, client.node_id, lambda: client.generation,
                                    on_reply, self._refused, self._start_unary)
        self._stream = keepalive.STREAMS.add(
            client._stream_key(interval), self._beat,
            functools.partial(client._keepalive_stream, interval))

    @property
    def error(self) -> Exception | None:
        """The error of the last heartbeat (None after a success)."""
        if self._thread is None and self._beat is not None:
            return self._beat.error
        return self._error

    def _refused(self, error: Exception) -> None:
        if not self._stop.is_set() and self._on_stop is not None:
            self._on_stop(error)

    def _start_unary(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="tfelastic-heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            self._beat_unary()
        except Exception as e:  # noqa: BLE001 - the owner must hear why its heartbeats ended
            if self._stop.is_set():
                return  # stopped in the middle of a call: nobody waits for more
            self._error = e
            if self._on_stop is not None and isinstance(e, RendezvousError):
                self._on_stop(e)  # the orchestrator's answer (removed, run failed): its owner says why
                return
            logger.exception("heartbeats to the orchestrator stopped")
            if self._on_stop is not None:
                self._on_stop(e)

    def _beat_unary(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                info = self._client.heartbeat()
            except RendezvousError as e:
                self._error = e  # kept for the owner
                if e.code in keepalive.TRANSIENT:
                    continue
                raise  # removed, run failed, ...: more heartbeats cannot help
            self._error = None
            if self._on_reply is not None:
                try:
                    self._on_reply(info)
                except Exception:  # noqa: BLE001 - a listener's bug must not silence the node
                    logger.exception("heartbeat listener failed; heartbeats go on")

    def stop(self, wait: bool = True) -> None:
        self._stop.set()
        if self._stream is not None and self._beat is not None:
            self._stream.remove(self._beat)
        thread = self._thread
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join()


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
