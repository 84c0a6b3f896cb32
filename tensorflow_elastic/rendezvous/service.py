"""The gRPC servicer: checks requests, routes them to their run, turns results into protos.

Requests are validated here, before they reach a run, so a bad request never
changes state; errors become gRPC status codes with the ``tfe-reason``
trailing metadata the client turns back into exception classes. Callers need
no token unless one is set, so every size and count a caller can grow is
capped (the limits below and in RunSettings), and runs without a live node
expire.

When a generation forms, every member's join returns and every watcher gets
an update, all carrying the member map, or what changed in it since the map the
client holds (map_replies.py: encoded once per change, sent as bytes), packed for clients that
read packed maps (packed_maps.py).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

import grpc

from tensorflow_elastic import rpc
from tensorflow_elastic.net import parse_address
from tensorflow_elastic.observability.events import EventLog
from tensorflow_elastic.proto import rendezvous_pb2 as pb
from tensorflow_elastic.rendezvous.errors import (
    UNKNOWN_RUN, InvalidArgumentError, LimitReachedError, RendezvousError)
from tensorflow_elastic.rendezvous.liveness import LoopClock
from tensorflow_elastic.rendezvous.map_replies import MapReplies, known_map
from tensorflow_elastic.rendezvous.member_deltas import MapVersion
from tensorflow_elastic.rendezvous.metrics import Metrics
from tensorflow_elastic.rendezvous.refusals import check_last_generation
from tensorflow_elastic.rendezvous.run import Run
from tensorflow_elastic.rendezvous.run_state import RunState, decode
from tensorflow_elastic.rendezvous.settings import MAX_JOINS_PER_CALL, RunSettings
from tensorflow_elastic.rendezvous.store import MembershipStore
from tensorflow_elastic.rendezvous.types import HeartbeatInfo, JoinEntry, Membership, NodeBounds

MAX_RUN_ID = 128
MAX_ADDRESS = 256
MAX_NONCE = 64
MAX_NAME = 256
MAX_REASON = 1024
# Status replies are cut to fit gRPC's default 4 MiB receive limit, with room for framing.
MAX_REPLY_BYTES = 4 * 1024 * 1024 - 64 * 1024
# The expiry sweep runs at least this often (more often for a short --run_expiry).
_SWEEP_INTERVAL_S = 30.0
MAX_NODES = 100_000
MAX_TIMEOUT_S = 7 * 24 * 3600.0
# Nodes one KeepAlive message may beat for (a process of many simulated nodes, an agent's workers).
MAX_BEATS = 100_000

_BARRIER = "barrier"
_SYNC = "synchronize"
# The key of a join reply's tail that names the map without its members.
_BARE = (None, True, False)


def _rpc(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Counts the call and turns a :class:`RendezvousError` into its status code."""
    name = method.__name__

    @functools.wraps(method)
    async def wrapper(self: "RendezvousService", request: Any,
                      context: grpc.aio.ServicerContext) -> Any:
        try:
            response = await method(self, request, context)
        except RendezvousError as e:
            self._metrics.rpc_done(name, e.code.name)
            await _abort(context, e)
        self._metrics.rpc_done(name, "OK")
        return response

    return wrapper


async def _abort(context: grpc.aio.ServicerContext, error: RendezvousError) -> None:
    await context.abort(error.code, error.message,
                        trailing_metadata=rpc.reason_metadata(error))


class RendezvousService:
    """Serves every run of this orchestrator; a run is created by its first join, once the
    join has passed every check that does not need the run."""

    def __init__(self, settings: RunSettings, store: MembershipStore, events: EventLog,
                 metrics: Metrics):
        self._settings = settings
        self._store = store
        self._events = events
        self._metrics = metrics
        self._runs: dict[str, Run] = {}
        # Each run's current membership (by the run's version) and its maps as replies.
        self._memberships: dict[str, tuple[int, Membership]] = {}
        self._map_replies: dict[str, MapReplies] = {}
        # Runs being deleted; a new run of the same id waits for its file to go.
        self._deleting: dict[str, asyncio.Task] = {}
        self._watches: collections.Counter[str] = collections.Counter()
        self._sweeper: asyncio.Task | None = None
        # One clock for every run: it measures the stalls of the loop they share.
        self._clock = LoopClock()
        self._clock_ticks: asyncio.Task | None = None

    async def load(self) -> None:
        """Restores the runs saved in the store and starts their timers; a run that cannot be
        restored is set aside rather than keeping every other run from being served."""
        self._clock_ticks = asyncio.get_running_loop().create_task(self._clock.tick())
        for run_id, snapshot in self._store.load().items():
            try:
                state = decode(snapshot, self._settings)
            except Exception as e:  # noqa: BLE001 - a file can hold anything
                self._store.set_aside(run_id, f"{type(e).__name__}: {e}")
                continue
            self._add_run(state).start()
        self._sweeper = asyncio.get_running_loop().create_task(self._expire_idle_runs())

    @property
    def run_count(self) -> int:
        return len(self._runs)

    def halt(self) -> None:
        """Every run stops deciding at once (see Run.halt); close() follows."""
        for run in self._runs.values():
            run.halt()

    async def close(self) -> None:
        for task in (self._sweeper, self._clock_ticks):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        for run in self._runs.values():
            await run.close()
        await asyncio.gather(*self._deleting.values(), return_exceptions=True)
        self._store.close()

    async def _expire_idle_runs(self) -> None:
        """Deletes runs that have had no live node for ``run_expiry`` seconds, from memory and
        store: ended jobs and abandoned runs must not pile up in a long-lived orchestrator."""
        expiry = self._settings.run_expiry
        while True:
            await asyncio.sleep(min(expiry / 4, _SWEEP_INTERVAL_S))
            now = time.monotonic()
            for run_id, run in list(self._runs.items()):
                if run.idle_for(now) >= expiry:
                    self._delete(run_id)

    def _delete(self, run_id: str) -> None:
        run = self._runs.pop(run_id)
        self._memberships.pop(run_id, None)
        self._map_replies.pop(run_id, None)
        self._metrics.forget_run(run_id)

        async def delete() -> None:
            try:
                await run.close()
                await asyncio.get_running_loop().run_in_executor(None, self._store.delete, run_id)
            finally:
                del self._deleting[run_id]

        self._deleting[run_id] = asyncio.get_running_loop().create_task(delete())

    def _add_run(self, state: RunState) -> Run:
        run = Run(state, self._settings, self._store, self._events, self._metrics, self._clock)
        self._runs[state.run_id] = run
        return run

    async def _new_run(self, request: pb.JoinRequest) -> Run:
        """The run a first join creates, once the run of that id being deleted is gone."""
        deleting = self._deleting.get(request.run_id)
        if deleting is not None:
            await asyncio.gather(deleting, return_exceptions=True)
        run = self._runs.get(request.run_id)  # another join may have created it meanwhile
        if run is not None:
            return run
        limit = self._settings.max_runs
        if len(self._runs) >= limit:
            raise LimitReachedError(
                f"this orchestrator serves {limit} runs, its most (max_runs); a run with no "
                f"live node is deleted {self._settings.run_expiry:g} s after (run_expiry): "
                f"try again later, or use another orchestrator")
        run = self._add_run(RunState.new(request.run_id, request.min_nodes, request.max_nodes,
                                         self._settings))
        run.start()
        return run

    def _run(self, run_id: str) -> Run:
        _check_run_id(run_id)
        run = self._runs.get(run_id)
        if run is None:
            raise RendezvousError(f"this orchestrator has no run {run_id!r}; check --run_id, "
                                  f"or join first", reason=UNKNOWN_RUN)
        return run

    def method_handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        """The service's method handlers by method name; a reply may be a message or its
        serialized bytes."""
        handlers = {}
        for method in _SERVICE.methods:
            make = _HANDLER_KINDS[method.client_streaming, method.server_streaming]
            handlers[method.name] = make(
                getattr(self, method.name),
                request_deserializer=getattr(pb, method.input_type.name).FromString,
                response_serializer=_serialize)
        return handlers

    def handler(self) -> grpc.GenericRpcHandler:
        """The method handlers as one handler, for a server that routes calls itself."""
        return grpc.method_handlers_generic_handler(_SERVICE.full_name, self.method_handlers())

    def _membership(self, run: Run) -> Membership:
        """The current membership of ``run``, taken once per change of the run."""
        cached = self._memberships.get(run.run_id)
        if cached is None or cached[0] != run.version:
            cached = (run.version, run.membership())
            self._memberships[run.run_id] = cached
        return cached[1]

    def _replies(self, run: Run) -> MapReplies:
        replies = self._map_replies.get(run.run_id)
        if replies is None:
            replies = self._map_replies[run.run_id] = MapReplies()
        return replies

    def _join_tail(self, run: Run, request: pb.JoinRequest) -> bytes:
        """The run's current membership as the end of a join reply to ``request``."""
        return self._replies(run).join_tail(self._membership(run), known_map(request),
                                            request.omit_members, request.packed_maps)

    # ------------------------------------------------------------------ RPCs

    @_rpc
    async def Join(self, request: pb.JoinRequest, context: Any) -> bytes:
        (answer,), sent = await self._join_all([request])
        if isinstance(answer, RendezvousError):
            raise answer
        _when_sent(context, sent)
        head, tail = answer
        return head + tail

    @_rpc
    async def JoinMany(self, request: pb.JoinManyRequest, context: Any) -> bytes:
        """Each entry as a Join of its own (its checks, nonce, error), joined together; one
        reply once every entry is answered. The nodes' holds end when that reply has been sent,
        as a Join's would."""
        count = len(request.joins)
        if not 1 <= count <= MAX_JOINS_PER_CALL:
            raise InvalidArgumentError(
                f"{count} joins in one JoinMany call; send 1 to {MAX_JOINS_PER_CALL} (split "
                f"a larger launcher's nodes over several calls)")
        # One member map per run in a reply, however many entries ask: the others share it
        # (the reply would otherwise hold up to 1,024 copies of a 10,000-node map).
        asked: set[str] = set()
        for join in request.joins:
            if not join.omit_members:
                join.omit_members = join.run_id in asked
                asked.add(join.run_id)
        answers, sent = await self._join_all(request.joins)
        _when_sent(context, sent)
        # Each answer is field 1 of the response: a JoinAnswer holding the join's reply (its
        # field 1), or its error. Joined once: a reply may carry the whole member map.
        pieces: list[bytes] = []
        succeeded = 0
        for answer in answers:
            if isinstance(answer, RendezvousError):
                self._metrics.rpc_done("Join", answer.code.name)
                error = pb.JoinAnswer(code=answer.code.value[0], message=answer.message,
                                      reason=answer.reason).SerializeToString()
                pieces += (_field_prefix(1, len(error)), error)
                continue
            succeeded += 1
            head, tail = answer
            reply = _field_prefix(1, len(head) + len(tail))
            pieces += (_field_prefix(1, len(reply) + len(head) + len(tail)), reply, head, tail)
        if succeeded:
            self._metrics.rpc_done("Join", "OK", succeeded)
        return b"".join(pieces)

    async def _join_all(self, requests: Sequence[pb.JoinRequest]
                        ) -> tuple[list[tuple[bytes, bytes] | RendezvousError],
                                   list[Callable[[], None]]]:
        """Each join's serialized reply in two pieces (its head, the membership) or its error,
        in order, and what to call once the replies have been sent. The joins of one run are
        joined together (Run.join_many); registrations each on their own."""
        answers: list[tuple[bytes, bytes] | RendezvousError | None] = [None] * len(requests)
        batches: dict[Run, list[int]] = {}
        registrations = []
        # The run of entries that passed the run's checks, by what those checks read: a
        # launcher's entries differ only in their own fields (address, nonce, timeout). Kept
        # while nothing awaits, so no other call changed the run in between.
        checked: dict[tuple, Run] = {}
        for index, request in enumerate(requests):
            key = (request.run_id, request.min_nodes, request.max_nodes,
                   request.HasField("node_id"), request.register_only, request.last_generation)
            try:
                run = checked.get(key)
                if run is not None:
                    _check_entry(request)
                else:
                    created = request.run_id not in self._runs
                    try:
                        run = await self._run_for_join(request)
                    finally:
                        if created:  # it awaited: other calls may have changed any run
                            checked.clear()
                    checked[key] = run
            except RendezvousError as e:
                answers[index] = e
                continue
            if request.register_only:
                registrations.append(self._register(run, requests, index, answers))
            else:
                batches.setdefault(run, []).append(index)
        sent: list[Callable[[], None]] = []
        calls = registrations + [self._join_batch(run, requests, indices, answers, sent)
                                 for run, indices in batches.items()]
        if len(calls) == 1:
            await calls[0]  # the usual case: no task to make
        else:
            await asyncio.gather(*calls)
        return answers, sent  # type: ignore[return-value]  # every request has its answer

    async def _run_for_join(self, request: pb.JoinRequest) -> Run:
        """Checks a join and returns its run, created by a first join."""
        _check_run_id(request.run_id)
        _check_entry(request)
        if request.max_nodes < 1:
            raise InvalidArgumentError(f"max_nodes={request.max_nodes}: it must be at least 1")
        try:
            NodeBounds(request.min_nodes, request.max_nodes)
        except ValueError:
            raise InvalidArgumentError(
                f"min_nodes={request.min_nodes}, max_nodes={request.max_nodes}: need "
                f"1 <= min_nodes <= max_nodes") from None
        if request.max_nodes > MAX_NODES:
            raise InvalidArgumentError(f"max_nodes={request.max_nodes} exceeds {MAX_NODES}")
        if request.last_generation < 0:
            raise InvalidArgumentError("last_generation must be 0 (none) or a generation number")
        if request.register_only and request.HasField("node_id"):
            raise InvalidArgumentError("register_only gives out a new id: omit node_id")
        run = self._runs.get(request.run_id)
        if run is None:
            if request.HasField("node_id"):
                raise RendezvousError(
                    f"this orchestrator has no run {request.run_id!r}, so node id "
                    f"{request.node_id} is unknown; join without a node id", reason=UNKNOWN_RUN)
            check_last_generation(request.last_generation, 0)
            run = await self._new_run(request)
        if not request.HasField("node_id"):
            run.start_afresh_if_ended(request.min_nodes, request.max_nodes)
        run.check_config(request.min_nodes, request.max_nodes)
        return run

    async def _register(self, run: Run, requests: Sequence[pb.JoinRequest], index: int,
                        answers: list) -> None:
        request = requests[index]
        try:
            node_id = await run.register(request.address, request.nonce)
        except RendezvousError as e:
            answers[index] = e
            return
        answers[index] = (pb.JoinResponse(node_id=node_id).SerializeToString(),
                          self._join_tail(run, request))

    async def _join_batch(self, run: Run, requests: Sequence[pb.JoinRequest],
                          indices: list[int], answers: list,
                          sent: list[Callable[[], None]]) -> None:
        """The joins ``indices`` of ``requests``, all of ``run``, joined together."""
        batch = [requests[index] for index in indices]
        joined = await run.join_many([
            JoinEntry(r.address, r.node_id if r.HasField("node_id") else None,
                      r.last_generation, r.nonce, r.timeout_s) for r in batch])
        held = []
        answered = []
        for index, request, answer in zip(indices, batch, joined):
            if isinstance(answer, RendezvousError):
                answers[index] = answer
            else:
                held.append((answer.node_id, not request.HasField("node_id")))
                answered.append((index, request, answer))
        interval = run.ask_interval([node_id for node_id, _ in held])
        # The run's current membership, which is what _join_tail encodes: the same for the
        # whole batch (nothing awaits in between), so encoded once per map named and kind.
        tails: dict[tuple[MapVersion | None, bool, bool], bytes] = {}
        for index, request, answer in answered:
            key = (_BARE if request.omit_members  # the map's name: whatever map it names
                   else (known_map(request), False, request.packed_maps))
            tail = tails.get(key)
            if tail is None:
                tail = tails[key] = self._join_tail(run, request)
            answers[index] = (pb.JoinResponse(node_id=answer.node_id,
                                              taken_back_after=answer.taken_back_after,
                                              heartbeat_interval_s=interval
                                              ).SerializeToString(),
                              tail)
        if held:
            sent.append(run.hold_while_answering(held))

    @_rpc
    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> pb.HeartbeatResponse:
        return _heartbeat_reply(self._run(request.run_id).heartbeat(request.node_id,
                                                                    request.generation))

    async def KeepAlive(self, requests: AsyncIterator[pb.KeepAliveRequest],
                        context: grpc.aio.ServicerContext
                        ) -> AsyncIterator[pb.KeepAliveResponse | bytes]:
        """Takes every beat of every message as a Heartbeat; answers each message with the
        nodes whose answer changed since this stream last gave it, so that a steady stream
        costs one small read and one empty reply per message, whatever its nodes."""
        self._metrics.rpc_done("KeepAlive", "OK")
        told: dict[tuple[str, int], HeartbeatInfo] = {}
        async for request in requests:
            if len(request.beats) > MAX_BEATS:
                error = InvalidArgumentError(f"{len(request.beats)} beats in one message; "
                                             f"send at most {MAX_BEATS}")
                self._metrics.rpc_done("KeepAlive", error.code.name)
                await _abort(context, error)
            if len(told) > MAX_BEATS:
                told.clear()  # nodes that stopped beating on this stream: tell the rest anew
            answers = []
            for beat in request.beats:
                key = (beat.run_id, beat.node_id)
                try:
                    info = self._run(beat.run_id).heartbeat(beat.node_id, beat.generation)
                except RendezvousError as e:
                    told.pop(key, None)
                    answers.append(pb.KeepAliveAnswer(
                        run_id=beat.run_id, node_id=beat.node_id, code=e.code.value[0],
                        message=e.message, reason=e.reason))
                    continue
                if told.get(key) != info:
                    told[key] = info
                    answers.append(pb.KeepAliveAnswer(run_id=beat.run_id, node_id=beat.node_id,
                                                      info=_heartbeat_reply(info)))
            # The steady state, nothing to tell: an empty message, serialized as nothing.
            yield pb.KeepAliveResponse(answers=answers) if answers else b""

    async def Watch(self, request: pb.WatchRequest,
                    context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        try:
            run = self._run(request.run_id)
        except RendezvousError as e:
            self._metrics.rpc_done("Watch", e.code.name)
            await _abort(context, e)
        peer = rpc.peer_host(context.peer())
        try:
            self._check_watch_limits(peer)
        except RendezvousError as e:
            self._metrics.rpc_done("Watch", e.code.name)
            await _abort(context, e)
        self._metrics.rpc_done("Watch", "OK")
        node_id = request.node_id if request.HasField("node_id") else None
        # A watcher that names its map gets deltas, each against the update before it.
        base = known_map(request)
        packed = request.packed_maps
        self._watches[peer] += 1
        try:
            async for update in run.watch(node_id):
                encoded, version = self._replies(run).update(update, base, packed)
                if base is not None:
                    base = version
                yield encoded
        finally:
            self._watches[peer] -= 1
            if not self._watches[peer]:
                del self._watches[peer]

    def _check_watch_limits(self, peer: str) -> None:
        settings = self._settings
        if self._watches[peer] >= settings.max_watches_per_peer:
            raise LimitReachedError(
                f"{peer} has {self._watches[peer]} watch streams open, the most one host may "
                f"(max_watches_per_peer={settings.max_watches_per_peer}); close some, or "
                f"watch from fewer processes")
        if self._watches.total() >= settings.max_watches:
            raise LimitReachedError(
                f"this orchestrator has {self._watches.total()} watch streams open, its most "
                f"(max_watches={settings.max_watches}); try again later")

    @_rpc
    async def ReportFailure(self, request: pb.ReportFailureRequest,
                            context: Any) -> pb.ReportFailureResponse:
        run = self._run(request.run_id)
        if not request.peers:
            raise InvalidArgumentError("peers is empty: name the node ids you could not reach")
        _check_text("reason", request.reason, MAX_REASON)
        confirmed, alive = await run.report_failure(request.node_id, request.generation,
                                                    list(dict.fromkeys(request.peers)),
                                                    request.reason)
        return pb.ReportFailureResponse(confirmed=confirmed, alive=alive,
                                        generation=run.generation)

    @_rpc
    async def Barrier(self, request: pb.BarrierRequest, context: Any) -> pb.BarrierResponse:
        run = self._run(request.run_id)
        _check_name("name", request.name)
        _check_timeout(request.timeout_s)
        await run.gather(_BARRIER, request.name, request.node_id, request.generation, b"",
                         request.timeout_s)
        return pb.BarrierResponse()

    @_rpc
    async def Synchronize(self, request: pb.SynchronizeRequest,
                          context: Any) -> pb.SynchronizeResponse:
        run = self._run(request.run_id)
        _check_name("key", request.key)
        _check_timeout(request.timeout_s)
        limit = self._settings.max_value_bytes
        if len(request.value) > limit:
            raise InvalidArgumentError(
                f"value of {len(request.value)} bytes exceeds the {limit}-byte limit; exchange "
                f"only small values (addresses, ports, flags) and move data another way")
        values = await run.gather(_SYNC, request.key, request.node_id, request.generation,
                                  request.value, request.timeout_s)
        return pb.SynchronizeResponse(values=values)

    @_rpc
    async def Leave(self, request: pb.LeaveRequest, context: Any) -> pb.LeaveResponse:
        run = self._run(request.run_id)
        _check_text("reason", request.reason, MAX_REASON)
        await run.leave(request.node_id, request.reason, request.job_finished)
        return pb.LeaveResponse()

    @_rpc
    async def Status(self, request: pb.StatusRequest, context: Any) -> pb.StatusResponse:
        runs = [self._run(request.run_id)] if request.run_id else list(self._runs.values())
        reply = pb.StatusResponse(runs=[self._status(run) for run in runs])
        fit_status(reply)
        return reply

    def _status(self, run: Run) -> pb.RunStatus:
        s = run.status()
        return pb.RunStatus(
            run_id=s.run_id, min_nodes=s.min_nodes, max_nodes=s.max_nodes,
            state=pb.RunState.Value(s.state), reason=s.reason,
            membership=self._replies(run).membership(self._membership(run)),
            nodes=[pb.NodeStatus(node_id=n.node_id, address=n.address, role=n.role,
                                 silent_s=n.silent_s) for n in s.nodes],
            history=[pb.HistoryEntry(**entry) for entry in s.history],
            blocklist=[pb.BlockedAddress(address=a, failures=f, remaining_s=r)
                       for a, f, r in s.blocklist])


_SERVICE = pb.DESCRIPTOR.services_by_name["Rendezvous"]
# (client streaming, server streaming) -> how gRPC serves such a method.
_HANDLER_KINDS = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def _heartbeat_reply(info: HeartbeatInfo) -> pb.HeartbeatResponse:
    return pb.HeartbeatResponse(generation=info.generation, state=pb.RunState.Value(info.state),
                                waiting=info.waiting, removed=info.removed, member=info.member,
                                queued=info.queued)


def _when_sent(context: Any, sent: list[Callable[[], None]]) -> None:
    """Calls each of ``sent`` once the call's reply has been sent (or the call ended)."""
    if sent:
        context.add_done_callback(lambda _: [reply_sent() for reply_sent in sent])


@functools.lru_cache(maxsize=4096)
def _field_prefix(number: int, size: int) -> bytes:
    """What precedes a serialized message of ``size`` bytes as field ``number`` of the message
    that holds it, so that replies encoded once are nested without being parsed again. Cached:
    the replies of a formation come in a few sizes."""
    prefix = bytearray([number << 3 | 2])
    while size > 0x7F:
        prefix.append(size & 0x7F | 0x80)
        size >>= 7
    prefix.append(size)
    return bytes(prefix)


def _serialize(reply: Any) -> bytes:
    return reply if isinstance(reply, bytes) else reply.SerializeToString()


def _check_entry(request: pb.JoinRequest) -> None:
    """A join's checks of the fields that are its own (not its run's)."""
    _check_address(request.address)
    _check_text("nonce", request.nonce, MAX_NONCE)
    _check_timeout(request.timeout_s)


def _check_run_id(run_id: str) -> None:
    if not run_id:
        raise InvalidArgumentError("run_id is empty: give every node of a job the same run id "
                                   "(--run_id)")
    _check_text("run_id", run_id, MAX_RUN_ID)


def _check_name(field: str, value: str) -> None:
    if not value:
        raise InvalidArgumentError(f"{field} is empty: name it")
    _check_text(field, value, MAX_NAME)


def _check_text(field: str, value: str, limit: int) -> None:
    if len(value) > limit:
        raise InvalidArgumentError(f"{field} is {len(value)} characters long; the limit is {limit}")


def fit_status(reply: pb.StatusResponse, limit: int = MAX_REPLY_BYTES) -> None:
    """Cuts ``reply`` to ``limit`` bytes, so that any client can read it: halves the node list
    (waiting nodes go first) and the history (oldest first) of the largest run until it fits,
    and says so in a last history entry of each run it cut."""
    if reply.ByteSize() <= limit:
        return
    left_out: dict[int, list[int]] = {}  # run index -> [nodes, history entries] left out
    while reply.ByteSize() > limit:
        index, run = max(enumerate(reply.runs), key=lambda item: item[1].ByteSize())
        counts = left_out.setdefault(index, [0, 0])
        if len(run.nodes) <= 1 and len(run.history) <= 1:
            break  # nothing left to cut: the note below must still fit
        if run.history and run.history[-1].event == _TRUNCATED:
            run.history.pop()
        nodes, history = len(run.nodes) // 2, len(run.history) // 2
        del run.nodes[len(run.nodes) - nodes:]
        del run.history[:history]
        counts[0] += nodes
        counts[1] += history
        run.history.append(_truncation_note(*counts, limit))
    for index, (nodes, history) in left_out.items():
        run = reply.runs[index]
        if run.history and run.history[-1].event == _TRUNCATED:
            run.history.pop()
        run.history.append(_truncation_note(nodes, history, limit))


_TRUNCATED = "truncated"


def _truncation_note(nodes: int, history: int, limit: int) -> pb.HistoryEntry:
    return pb.HistoryEntry(
        time=time.time(), event=_TRUNCATED,
        detail=f"{nodes} nodes and {history} older history entries left out to keep the reply "
               f"under {limit} bytes; ask for this run alone (--run_id), or read the events file")


def _check_address(address: str) -> None:
    _check_text("address", address, MAX_ADDRESS)
    try:
        parse_address(address)
    except ValueError:  # AddressError, or int() of a digit it cannot read (e.g. "²")
        raise InvalidArgumentError(
            f"address {address!r} is not HOST:PORT; give the host and port other nodes reach "
            f"this node at, e.g. 10.0.0.5:2222") from None


def _check_timeout(timeout_s: float) -> None:
    if not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise InvalidArgumentError(
            f"timeout_s={timeout_s:g}: it must be > 0 and at most {MAX_TIMEOUT_S:g} seconds")
