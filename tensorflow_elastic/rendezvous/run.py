"""The generation state machine of one run.

All state of a run lives on the orchestrator's event loop, so no locks are
needed: a method runs to its first ``await`` without interruption. Waiting
calls (joins, barriers, watches) sleep on events that are set when the state
they wait for changes, never by polling.

States: FORMING (no generation: gathering min_nodes), ACTIVE (generation G
runs), FAILED (terminal). A generation forms

* at the first rendezvous, when min_nodes have joined and the last call has
  passed, or at once when max_nodes have joined;
* when a member is removed (heartbeat timeout, confirmed failure report,
  leave): survivors plus admissible waiting nodes, at once; below min_nodes the
  run goes back to FORMING and fails if nobody comes back in time;
* when a member of G re-joins G: the members agreed (at a commit boundary) to
  end G, so G+1 forms at once and admits the waiting nodes.

See docs/orchestrator.md for the whole protocol.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import dataclasses
import time
from typing import Any, AsyncIterator, Protocol

from tensorflow_elastic.observability import events as ev
from tensorflow_elastic.rendezvous.blocklist import Blocklist
from tensorflow_elastic.rendezvous.errors import (
    GenerationChangedError, InvalidArgumentError, NodeRemovedError, RendezvousError,
    RendezvousTimeoutError, RunFailedError, NOT_MEMBER, RUN_MISMATCH, UNKNOWN_NODE)
from tensorflow_elastic.rendezvous.liveness import Liveness
from tensorflow_elastic.rendezvous.store import GroupCommitter, MembershipStore, Snapshot
from tensorflow_elastic.rendezvous.types import (
    ACTIVE, FAILED, FORMING, HeartbeatInfo, Membership, MembershipUpdate, NodeStatus, RunStatus)

SNAPSHOT_FORMAT = 1
_PAST_GENERATIONS = 32


@dataclasses.dataclass
class RunSettings:
    """Timing and limits of the state machine (the orchestrator's flags)."""

    heartbeat_timeout: float = 10.0
    last_call: float = 2.0
    below_min_timeout: float = 300.0
    probe_timeout: float = 1.0
    watch_loss_grace: float = 2.0
    blocklist_after: int = 2
    blocklist_cooldown: float = 10.0
    blocklist_max_cooldown: float = 600.0
    max_value_bytes: int = 64 * 1024
    history_size: int = 100


class RunObserver(Protocol):
    """What the metrics module learns from a run."""

    def membership_changed(self, run_id: str, generation: int, members: int,
                           waiting: int) -> None: ...

    def rendezvous_done(self, run_id: str, seconds: float) -> None: ...


@dataclasses.dataclass
class Node:
    node_id: int
    address: str
    nonce: str = ""


class Run:
    def __init__(self, run_id: str, min_nodes: int, max_nodes: int, settings: RunSettings,
                 store: MembershipStore, events: ev.EventLog, observer: RunObserver):
        self.run_id = run_id
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes
        self.settings = settings
        self._events = events
        self._observer = observer
        self._committer = GroupCommitter(store, run_id, self.snapshot)
        self._next_id = 0
        self._generation = 0
        self._state = FORMING
        self._reason = ""
        self._nodes: dict[int, Node] = {}
        self._nonces: dict[str, int] = {}
        self._members: dict[int, str] = {}
        self._waiting: dict[int, Node] = {}
        self._removed: dict[int, str] = {}
        self._past: collections.OrderedDict[int, frozenset[int]] = collections.OrderedDict()
        self._liveness = Liveness()
        self._blocklist = Blocklist(settings.blocklist_after, settings.blocklist_cooldown,
                                    settings.blocklist_max_cooldown)
        self._history: collections.deque[dict[str, Any]] = collections.deque(
            maxlen=settings.history_size)
        # Barriers and exchanges of the current generation: name -> node -> value.
        self._gathers: dict[str, dict[int, bytes]] = {}
        self._gathered: dict[str, dict[int, bytes]] = {}
        self._gather_events: dict[str, asyncio.Event] = {}
        self._gather_tickets: dict[str, int] = {}
        self._last_call_at: float | None = None
        self._below_min_at: float | None = None
        self._forming_since = time.monotonic()
        self._unacked: set[int] | None = None
        self._formed_ticket = 0
        self._version = 0
        self._changed = asyncio.Event()
        self._formed = asyncio.Event()
        self._timer_wake = asyncio.Event()
        self._timer: asyncio.Task | None = None
        # Open watch streams per node, and when a member's last one broke.
        self._watches: collections.Counter[int] = collections.Counter()
        self._watch_lost_at: dict[int, float] = {}

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Starts the failure detector and timers; call on the event loop."""
        self._timer = asyncio.get_running_loop().create_task(self._timer_loop())
        self._maybe_form()
        self._notify(formed=False)

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            await asyncio.gather(self._timer, return_exceptions=True)

    # ------------------------------------------------------------------ queries

    @property
    def state(self) -> str:
        return self._state

    @property
    def version(self) -> int:
        return self._version

    @property
    def generation(self) -> int:
        return self._generation

    def membership(self, node_id: int | None = None) -> Membership:
        members = dict(self._members)
        return Membership(node_id, self._generation, members, min(members, default=-1))

    def update(self) -> MembershipUpdate:
        return MembershipUpdate(self.membership(), self._state, self._admissible(), self._reason)

    def check_config(self, min_nodes: int, max_nodes: int) -> None:
        if (min_nodes, max_nodes) != (self.min_nodes, self.max_nodes):
            raise RendezvousError(
                f"run {self.run_id!r} was started with min_nodes={self.min_nodes} "
                f"max_nodes={self.max_nodes} but this node asks for {min_nodes}:{max_nodes}; "
                f"start every node with the same --nnodes", reason=RUN_MISMATCH)

    # ------------------------------------------------------------------ calls

    async def join(self, address: str, node_id: int | None, last_generation: int, nonce: str,
                   timeout: float) -> Membership:
        """Returns once the node is a member of a generation newer than ``last_generation``."""
        self._check_not_failed()
        if last_generation > self._generation:
            raise InvalidArgumentError(
                f"last_generation={last_generation} does not exist yet (the current generation "
                f"is {self._generation}); pass the generation your last join returned")
        if node_id is None:
            node = await self._admit_new(address, nonce)
        else:
            node = self._known_node(node_id)
            if node.address != address:
                raise RendezvousError(
                    f"node {node_id} joined with address {node.address}, not {address}; a node "
                    f"keeps its address: join without a node id to join as a new node",
                    reason=UNKNOWN_NODE)
            if (self._state == ACTIVE and node_id in self._members
                    and last_generation == self._generation):
                self._form(list(self._members) + self._admissible_ids(),
                           f"node {node_id} re-joined generation {self._generation}")
            elif (node_id not in self._members and node_id not in self._waiting
                  and node_id not in self._removed):
                self._enqueue(node)
        return await self._wait_for_generation(node, last_generation, timeout)

    async def register(self, address: str, nonce: str) -> int:
        """Gives a node its permanent id without queueing it; it joins later with that id."""
        self._check_not_failed()
        return (await self._admit_new(address, nonce, enqueue=False)).node_id

    def heartbeat(self, node_id: int, generation: int) -> HeartbeatInfo:
        self._check_not_failed()
        self._known_node(node_id)
        if generation > self._generation:
            raise InvalidArgumentError(
                f"generation {generation} does not exist yet (the current generation is "
                f"{self._generation}); send the generation your last join returned")
        self._liveness.touch(node_id, time.monotonic())
        member = self._state == ACTIVE and node_id in self._members
        if member and generation == self._generation:
            self._ack(node_id)
        return HeartbeatInfo(generation=self._generation, state=self._state,
                             waiting=self._admissible(), removed=self._removed_since(generation),
                             member=member, queued=len(self._waiting))

    async def watch(self, node_id: int | None = None) -> AsyncIterator[MembershipUpdate]:
        """Yields the current membership, then the latest one after each change.

        Bursts of changes coalesce into one update, so a slow watcher never
        falls behind. Ends after the run fails. A member's broken stream is a
        hint that its process is gone (see `_watch_ended`).
        """
        if node_id is not None:
            self._watches[node_id] += 1
            self._watch_lost_at.pop(node_id, None)
        try:
            sent = -1
            while True:
                changed = self._changed
                if self._version != sent:
                    sent = self._version
                    yield self.update()
                    if self._state == FAILED:
                        return
                    continue
                await changed.wait()
        finally:
            if node_id is not None:
                self._watch_ended(node_id)

    def _watch_ended(self, node_id: int) -> None:
        """A process that dies closes its connection, and its watch breaks at once.

        A live one sends its next heartbeat (or watches again) within its
        heartbeat interval; a member that does neither for `watch_loss_grace`
        after its watch broke is removed then, not at its heartbeat timeout:
        members blocked in a barrier or a sync with it stop waiting sooner.
        """
        self._watches[node_id] -= 1
        if self._watches[node_id] > 0:
            return
        del self._watches[node_id]
        if self._state == ACTIVE and node_id in self._members:
            self._watch_lost_at[node_id] = time.monotonic()
            self._timer_wake.set()

    def _check_lost_watches(self, now: float) -> None:
        grace = self.settings.watch_loss_grace
        gone = []
        for node_id, lost_at in list(self._watch_lost_at.items()):
            heard_since = self._liveness.silent_for(node_id, now) < now - lost_at
            if heard_since or node_id not in self._members:
                del self._watch_lost_at[node_id]
            elif now - lost_at >= grace:
                del self._watch_lost_at[node_id]
                gone.append(node_id)
        if gone:
            self._remove(gone, f"its connection closed and it sent nothing for {grace:g} s",
                         failed=True)

    async def report_failure(self, node_id: int, generation: int, peers: list[int],
                             reason: str) -> tuple[list[int], list[int]]:
        """Checks the reported peers; removes those confirmed dead. Returns (confirmed, alive).

        A report made in an ended generation still counts for the peers that
        are members now: a member that died while the others re-formed is
        removed at once, not at its heartbeat timeout. The orchestrator's own
        probe decides, so a stale reporter cannot remove a live node.
        """
        if node_id in peers:
            raise InvalidArgumentError(f"node {node_id} reported itself; use Leave instead")
        if self._is_current_member(node_id, generation):
            for peer in peers:
                if peer not in self._members:
                    raise InvalidArgumentError(
                        f"peer {peer} is not a member of generation {generation} (members: "
                        f"{sorted(self._members)}); report only peers of your generation")
        else:
            peers = [peer for peer in peers if peer in self._members]
        self._liveness.touch(node_id, time.monotonic())
        verdicts = await asyncio.gather(*(self._is_dead(peer, self._members[peer])
                                          for peer in peers))
        dead = [peer for peer, is_dead in zip(peers, verdicts) if is_dead]
        alive = [peer for peer, is_dead in zip(peers, verdicts) if not is_dead]
        # The state may have moved on while probing: remove only current members.
        dead_now = [peer for peer in dead if peer in self._members]
        if dead_now:
            await self._committer.wait(self._remove(
                dead_now, f"reported by node {node_id}: {reason or 'unreachable'}", failed=True))
        return dead, alive

    async def gather(self, kind: str, name: str, node_id: int, generation: int, value: bytes,
                     timeout: float) -> dict[int, bytes]:
        """Barrier and exchange: returns every member's value once all have put theirs."""
        self._check_member(node_id, generation)
        self._liveness.touch(node_id, time.monotonic())
        self._ack(node_id)
        key = f"{kind}/{name}"
        deadline = time.monotonic() + timeout
        if key not in self._gathered:
            self._gathers.setdefault(key, {})[node_id] = value
            if self._gathers[key].keys() >= self._members.keys():
                self._gathered[key] = self._gathers.pop(key)
                self._gather_tickets[key] = self._committer.mark()
                self._gather_event(key).set()
        while key not in self._gathered:
            self._check_member(node_id, generation, waiting_for=f"{kind} {name!r}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(self._members.keys() - self._gathers.get(key, {}).keys())
                raise RendezvousTimeoutError(
                    f"{kind} {name!r} of generation {generation} timed out after {timeout:g} s; "
                    f"missing nodes: {missing} (addresses: "
                    f"{[self._members[m] for m in missing]}); they may be slow, hung or dead: "
                    f"check their logs, or raise the timeout")
            await _wait(self._gather_event(key), remaining)
        # Everyone answers only after the result is durable: after a restart, a member
        # that retries finds it instead of waiting for members that already moved on.
        await self._committer.wait(self._gather_tickets.get(key, 0))
        self._check_member(node_id, generation)
        return dict(self._gathered[key])

    async def leave(self, node_id: int, reason: str) -> None:
        if node_id in self._removed:
            return
        self._check_not_failed()
        self._known_node(node_id)
        await self._committer.wait(
            self._remove([node_id], f"left: {reason or 'no reason given'}", failed=False))

    def status(self) -> RunStatus:
        now = time.monotonic()
        nodes = [NodeStatus(node_id, self._members[node_id], "member",
                            self._liveness.silent_for(node_id, now))
                 for node_id in sorted(self._members)]
        nodes += [NodeStatus(node_id, self._waiting[node_id].address, "waiting",
                             self._liveness.silent_for(node_id, now))
                  for node_id in sorted(self._waiting)]
        return RunStatus(self.run_id, self.min_nodes, self.max_nodes, self._state, self._reason,
                         self.membership(), nodes, list(self._history), self._blocklist.blocked())

    # --------------------------------------------------------------- internals

    async def _admit_new(self, address: str, nonce: str, enqueue: bool = True) -> Node:
        """Gives a new node its permanent id (or finds it again on a retried join)."""
        if nonce in self._nonces:
            return self._known_node(self._nonces[nonce])
        self._blocklist.check(address)
        node = Node(self._next_id, address, nonce)
        self._next_id += 1
        # The id is durable before anyone sees it, so a restart never gives it out again.
        await self._committer.wait(self._committer.mark())
        self._check_not_failed()
        self._nodes[node.node_id] = node
        if nonce:
            self._nonces[nonce] = node.node_id
        self._liveness.touch(node.node_id, time.monotonic())
        if enqueue:
            self._enqueue(node)
        else:
            self._committer.mark()
            self._log(ev.NODE_JOINED, node.node_id, [node.node_id],
                      f"registered, address {address}", address=address)
        return node

    def _enqueue(self, node: Node) -> None:
        """Puts a node in the waiting queue: the next generation admits it."""
        self._waiting[node.node_id] = node
        self._committer.mark()
        self._log(ev.NODE_JOINED, node.node_id, [node.node_id],
                  f"waiting, address {node.address}", address=node.address)
        self._maybe_form()
        self._notify(formed=False)

    async def _wait_for_generation(self, node: Node, after: int, timeout: float) -> Membership:
        deadline = time.monotonic() + timeout
        self._liveness.hold(node.node_id)
        try:
            while True:
                self._check_not_failed()
                if node.node_id in self._removed:
                    raise NodeRemovedError(self._removed_message(node.node_id))
                if (self._state == ACTIVE and node.node_id in self._members
                        and self._generation > after):
                    await self._committer.wait(self._formed_ticket)
                    if self._state == ACTIVE and node.node_id in self._members:
                        break
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RendezvousTimeoutError(self._join_timeout_message(node, timeout))
                await _wait(self._formed, remaining)
        finally:
            self._liveness.release(node.node_id, time.monotonic())
            if node.node_id not in self._nodes:
                self._liveness.forget(node.node_id)
        self._ack(node.node_id)
        return self.membership(node.node_id)

    def _join_timeout_message(self, node: Node, timeout: float) -> str:
        if self._state == FORMING and self._generation == 0:
            return (f"no generation formed within {timeout:g} s: {len(self._waiting)} node(s) "
                    f"joined, min_nodes={self.min_nodes}; start more nodes or lower min_nodes")
        if self._state == FORMING:
            return (f"run {self.run_id!r} is below min_nodes ({len(self._waiting)} of "
                    f"{self.min_nodes}) and no generation formed within {timeout:g} s; start "
                    f"more nodes (the run fails after --below_min_timeout)")
        return (f"node {node.node_id} is waiting to be admitted: generation {self._generation} "
                f"has {len(self._members)} of max_nodes={self.max_nodes} members and has not "
                f"re-formed within {timeout:g} s. Waiting nodes are admitted when a member "
                f"leaves or fails, or when the members re-join to grow; join again to keep "
                f"waiting")

    def _check_not_failed(self) -> None:
        if self._state == FAILED:
            raise RunFailedError(f"run {self.run_id!r} failed: {self._reason}")

    def _known_node(self, node_id: int) -> Node:
        if node_id in self._removed:
            raise NodeRemovedError(self._removed_message(node_id))
        node = self._nodes.get(node_id)
        if node is None:
            raise RendezvousError(
                f"node id {node_id} was never given out in run {self.run_id!r}; join without "
                f"a node id to get one", reason=UNKNOWN_NODE)
        return node

    def _removed_message(self, node_id: int) -> str:
        return (f"node {node_id} was removed from run {self.run_id!r} ({self._removed[node_id]}); "
                f"node ids are never reused: join without a node id to come back as a new node")

    def _check_member(self, node_id: int, generation: int, waiting_for: str = "") -> None:
        """Raises unless the node is a member of the current generation ``generation``."""
        self._check_not_failed()
        self._known_node(node_id)
        during = f" while waiting for {waiting_for}" if waiting_for else ""
        if generation > self._generation:
            raise InvalidArgumentError(
                f"generation {generation} does not exist yet (the current generation is "
                f"{self._generation}); use the generation your last join returned")
        if generation < self._generation or self._state != ACTIVE:
            raise GenerationChangedError(
                f"generation {generation} has ended{during} (the run is now "
                f"{self._state.lower()} at generation {self._generation}): join again with "
                f"last_generation={generation} to get the new membership")
        if node_id not in self._members:
            raise RendezvousError(
                f"node {node_id} is not a member of generation {generation}; it is waiting to "
                f"be admitted: join to wait for the next generation", reason=NOT_MEMBER)

    def _is_current_member(self, node_id: int, generation: int) -> bool:
        """Whether a known node speaks from the current generation (False: from an ended one)."""
        if generation < self._generation or self._state != ACTIVE:
            self._check_not_failed()
            self._known_node(node_id)
            return False
        self._check_member(node_id, generation)
        return True

    def _admissible_ids(self) -> list[int]:
        """Waiting nodes the next re-form admits: lowest ids first, up to max_nodes."""
        slots = self.max_nodes - len(self._members)
        return sorted(self._waiting)[:max(0, slots)]

    def _admissible(self) -> int:
        return max(0, min(len(self._waiting), self.max_nodes - len(self._members)))

    def _removed_since(self, generation: int) -> int:
        past = self._past.get(generation)
        if past is None or generation == self._generation and self._state == ACTIVE:
            return 0
        return len(past - self._members.keys())

    def _maybe_form(self) -> None:
        """Forms the first generation (or the next one after falling below min_nodes)."""
        if self._state != FORMING:
            return
        now = time.monotonic()
        count = len(self._waiting)
        if count >= self.max_nodes:
            self._form(sorted(self._waiting)[:self.max_nodes], f"max_nodes={self.max_nodes} joined")
        elif count < self.min_nodes:
            self._last_call_at = None
        else:
            if self._last_call_at is None:
                self._last_call_at = now + self.settings.last_call
                self._timer_wake.set()
            if now >= self._last_call_at:
                self._form(sorted(self._waiting), "the last call ended")

    def _form(self, ids: list[int], cause: str) -> None:
        ids = sorted(ids)
        self._generation += 1
        self._state = ACTIVE
        self._reason = cause
        self._members = {node_id: self._nodes[node_id].address for node_id in ids}
        for node_id in ids:
            self._waiting.pop(node_id, None)
        self._last_call_at = None
        self._below_min_at = None
        self._end_gathers()
        self._past[self._generation] = frozenset(ids)
        while len(self._past) > _PAST_GENERATIONS:
            self._past.popitem(last=False)
        self._unacked = set(ids)
        self._log(ev.GENERATION_START, None, ids, cause, members=ids, world_size=len(ids))
        self._formed_ticket = self._committer.mark()
        self._notify(formed=True)

    def _ack(self, node_id: int) -> None:
        """Notes that a member knows the current generation; once all do, the rendezvous is
        complete."""
        if self._unacked is None:
            return
        self._unacked.discard(node_id)
        if not self._unacked:
            self._unacked = None
            seconds = time.monotonic() - self._forming_since
            self._forming_since = time.monotonic()
            ids = sorted(self._members)
            self._log(ev.RENDEZVOUS_COMPLETE, None, ids, f"{len(ids)} members know generation "
                      f"{self._generation}", members=ids, world_size=len(ids),
                      duration_s=round(seconds, 6))
            self._observer.rendezvous_done(self.run_id, seconds)

    def _remove(self, ids: list[int], cause: str, failed: bool) -> int:
        """Removes nodes for good and re-forms if members were lost; returns the save ticket."""
        lost = []
        for node_id in ids:
            node = self._nodes.pop(node_id, None)
            if node is None:
                continue
            self._waiting.pop(node_id, None)
            self._nonces.pop(node.nonce, None)
            self._liveness.forget(node_id)
            self._removed[node_id] = cause
            if node_id in self._members:
                lost.append(node_id)
                if failed:
                    self._blocklist.record_failure(node.address)
            self._log(ev.NODE_LEFT, node_id, [node_id], cause, reason=cause)
        if failed and lost:
            self._log(ev.FAILURE_DETECTED, None, lost, cause, failed=lost, cause=cause)
        if lost and self._state == ACTIVE:
            self._forming_since = time.monotonic()
            survivors = [m for m in self._members if m not in lost]
            self._members = {m: self._members[m] for m in survivors}
            if len(survivors) + len(self._waiting) >= self.min_nodes:
                self._form(survivors + self._admissible_ids(), f"lost {lost}: {cause}")
            else:
                self._fall_below_min(survivors, lost, cause)
        else:
            self._maybe_form()
        ticket = self._committer.mark()
        self._notify(formed=True)
        return ticket

    def _fall_below_min(self, survivors: list[int], lost: list[int], cause: str) -> None:
        self._state = FORMING
        self._members = {}
        for node_id in survivors:
            self._waiting[node_id] = self._nodes[node_id]
        self._below_min_at = time.monotonic() + self.settings.below_min_timeout
        self._reason = (f"lost {lost} ({cause}); {len(self._waiting)} of min_nodes="
                        f"{self.min_nodes} remain")
        self._history_entry("below_min", None, survivors, self._reason)
        self._end_gathers()
        self._timer_wake.set()

    def _fail(self, reason: str) -> None:
        self._state = FAILED
        self._reason = reason
        self._log(ev.FAILURE_DETECTED, None, sorted(self._waiting), reason, failed=[],
                  cause=reason, fatal=True)
        self._committer.mark()
        self._end_gathers()
        self._notify(formed=True)

    async def _is_dead(self, peer: int, address: str) -> bool:
        """A reported peer is dead if it went quiet for half the heartbeat timeout, or if
        nothing accepts a connection at its address."""
        silent = self._liveness.silent_for(peer, time.monotonic())
        if silent > self.settings.heartbeat_timeout / 2:
            return True
        return not await _reachable(address, self.settings.probe_timeout)

    def _end_gathers(self) -> None:
        """The generation ended: wakes every barrier and exchange waiter and forgets them."""
        for event in self._gather_events.values():
            event.set()
        self._gathers.clear()
        self._gathered.clear()
        self._gather_events.clear()
        self._gather_tickets.clear()

    def _gather_event(self, key: str) -> asyncio.Event:
        return self._gather_events.setdefault(key, asyncio.Event())

    def _notify(self, formed: bool) -> None:
        self._version += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        if formed:
            done, self._formed = self._formed, asyncio.Event()
            done.set()
        self._observer.membership_changed(self.run_id, self._generation, len(self._members),
                                          len(self._waiting))

    def _log(self, event: str, node: int | None, nodes: list[int], detail: str,
             **fields: Any) -> None:
        self._history_entry(event, node, nodes, detail)
        self._events.record(event, node=node, generation=self._generation, run_id=self.run_id,
                            **fields)

    def _history_entry(self, event: str, node: int | None, nodes: list[int], detail: str) -> None:
        self._history.append({"time": time.time(), "event": event, "generation": self._generation,
                              "nodes": nodes if node is None else [node], "detail": detail})

    # -------------------------------------------------------------- timers

    async def _timer_loop(self) -> None:
        """Failure detector, last call and below-min deadline, sleeping until the next is due."""
        while self._state != FAILED:
            now = time.monotonic()
            self._on_timers(now)
            due = [now + 1.0]
            oldest = self._liveness.oldest()
            if oldest is not None:
                due.append(oldest[1] + self.settings.heartbeat_timeout)
            due += [t for t in (self._last_call_at, self._below_min_at) if t is not None]
            due += [t + self.settings.watch_loss_grace for t in self._watch_lost_at.values()]
            self._timer_wake.clear()
            await _wait(self._timer_wake, max(0.0, min(due) - now) + 0.001)

    def _on_timers(self, now: float) -> None:
        silent = self._liveness.expired(now, self.settings.heartbeat_timeout)
        if silent:
            self._remove(silent, f"no heartbeat for {self.settings.heartbeat_timeout:g} s",
                         failed=True)
        if self._state == ACTIVE:
            self._check_lost_watches(now)
        if self._state == FORMING and self._below_min_at is not None and now >= self._below_min_at:
            self._fail(f"{self._reason}, and not enough nodes came back within "
                       f"{self.settings.below_min_timeout:g} s (--below_min_timeout); restart "
                       f"the job with enough nodes")
        elif self._last_call_at is not None and now >= self._last_call_at:
            self._maybe_form()

    # ------------------------------------------------------------ persistence

    def snapshot(self) -> Snapshot:
        def nodes(ids: list[int]) -> list[list[Any]]:
            return [[i, self._nodes[i].address, self._nodes[i].nonce] for i in ids]

        wall_offset = time.time() - time.monotonic()
        return {
            "format": SNAPSHOT_FORMAT, "run_id": self.run_id, "min_nodes": self.min_nodes,
            "max_nodes": self.max_nodes, "next_id": self._next_id,
            "generation": self._generation, "state": self._state, "reason": self._reason,
            "members": nodes(sorted(self._members)), "waiting": nodes(sorted(self._waiting)),
            "registered": nodes(sorted(self._nodes.keys() - self._members.keys()
                                       - self._waiting.keys())),
            "removed": {str(i): cause for i, cause in self._removed.items()},
            "past": [[g, sorted(ids)] for g, ids in self._past.items()],
            "gathered": {key: {str(i): base64.b64encode(v).decode() for i, v in values.items()}
                         for key, values in self._gathered.items()},
            "blocklist": self._blocklist.snapshot(),
            "below_min_at": (None if self._below_min_at is None
                             else self._below_min_at + wall_offset),
            "history": list(self._history),
        }

    def restore(self, snapshot: Snapshot) -> None:
        """Loads a snapshot; every node gets a full heartbeat timeout to reconnect."""
        if snapshot.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(f"run {self.run_id!r}: unknown state format {snapshot.get('format')}")
        now = time.monotonic()
        self._next_id = snapshot["next_id"]
        self._generation = snapshot["generation"]
        self._state = snapshot["state"]
        self._reason = snapshot["reason"]
        for group in ("members", "waiting", "registered"):
            for node_id, address, nonce in snapshot.get(group, ()):
                node = Node(node_id, address, nonce)
                self._nodes[node_id] = node
                if nonce:
                    self._nonces[nonce] = node_id
                if group == "members":
                    self._members[node_id] = address
                elif group == "waiting":
                    self._waiting[node_id] = node
                self._liveness.touch(node_id, now)
        self._removed = {int(i): cause for i, cause in snapshot["removed"].items()}
        self._past = collections.OrderedDict((g, frozenset(ids)) for g, ids in snapshot["past"])
        self._gathered = {key: {int(i): base64.b64decode(v) for i, v in values.items()}
                          for key, values in snapshot["gathered"].items()}
        self._blocklist.restore(snapshot["blocklist"])
        if snapshot["below_min_at"] is not None:
            self._below_min_at = snapshot["below_min_at"] - (time.time() - time.monotonic())
        self._history.extend(snapshot["history"])
        if self._state == ACTIVE:
            self._unacked = set(self._members)


async def _wait(event: asyncio.Event, timeout: float) -> None:
    """Waits for ``event`` at most ``timeout`` seconds; the caller re-checks its condition."""
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except asyncio.TimeoutError:
        pass


async def _reachable(address: str, timeout: float) -> bool:
    """Whether something accepts a TCP connection at host:port within ``timeout``."""
    host, _, port = address.rpartition(":")
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host.strip("[]"), int(port)), timeout)
    except (OSError, ValueError, asyncio.TimeoutError):
        return False
    writer.close()
    return True
