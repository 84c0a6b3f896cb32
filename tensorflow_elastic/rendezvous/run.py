"""The generation state machine of one run.

All state of a run lives on the orchestrator's event loop, so no locks are
needed: a method runs to its first ``await`` without interruption. The state's
own transitions (run_state.py) change it and say what to do next; the checks
that refuse a call are in refusals.py. Waiting calls (joins, barriers, watches)
sleep on events that are set when the state they wait for changes, never by
polling. Every transition ends in :meth:`Run._commit`, which saves the state and
wakes whoever waits on it.

Phases: FORMING (no generation: gathering min_nodes), ACTIVE (generation G
runs), and the two ends: COMPLETED (every node left) and FAILED. The next first
join of an ended run starts it afresh (a completed one only where the orchestrator
serves job after job: see RunSettings.restart_completed). A generation forms

* at the first rendezvous, when min_nodes have joined and the last call has
  passed, or at once when max_nodes have joined;
* when a member is removed (heartbeat timeout, confirmed failure report,
  leave, broken watch): survivors plus admissible waiting nodes, at once; below
  min_nodes the run goes back to FORMING and fails if nobody comes back in time;
* when a member of G re-joins G: the members agreed (at a commit boundary) to
  end G, so G+1 forms at once and admits the waiting nodes.

See docs/orchestrator.md for the whole protocol.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, AsyncIterator, Callable, Protocol, Sequence

from tensorflow_elastic.observability import events as ev
from tensorflow_elastic.net import Probe, probe
from tensorflow_elastic.rendezvous import partition, refusals
from tensorflow_elastic.rendezvous.errors import (
    NotLeaderError, RendezvousError, RendezvousTimeoutError)
from tensorflow_elastic.rendezvous.liveness import (
    FIRST_BEAT_MAX_S, REPLY_HOLD_MAX_S, BeatIntervals, Liveness, LoopClock, WatchLoss)
from tensorflow_elastic.rendezvous.node_log import RangeCache
from tensorflow_elastic.rendezvous.run_state import (
    AfterRemoval, Forming, JoinStep, Node, RunState, encode)
from tensorflow_elastic.rendezvous.settings import (
    RunSettings, beat_interval_floor, liveness_timeout)
from tensorflow_elastic.rendezvous.store import GroupCommitter, MembershipStore, Snapshot
from tensorflow_elastic.rendezvous.types import (
    HeartbeatInfo, JoinEntry, Membership, MembershipUpdate, NodeStatus, Phase, RunStatus)
from tensorflow_elastic.rendezvous.wake import Wake


# Connection attempts to reported peers that one run makes at once.
MAX_CONCURRENT_PROBES = 16
# How often the timers of a replica whose lead ran out look whether it came back.
_FENCED_RECHECK_S = 0.05


class RunObserver(Protocol):
    """What the metrics module learns from a run."""

    def membership_changed(self, run_id: str, generation: int, members: int,
                           waiting: int) -> None: ...

    def rendezvous_done(self, run_id: str, seconds: float) -> None: ...


class Run:
    def __init__(self, state: RunState, settings: RunSettings, store: MembershipStore,
                 events: ev.EventLog, observer: RunObserver, clock: LoopClock | None = None):
        """Runs ``state``, new or loaded: every node a loaded state knows gets the reload grace
        to (re)connect, and the members of an active generation are expected to ack it again.
        ``clock`` measures silences (the serving loop's stalls left out; shared by the runs of
        one loop)."""
        self._state = state
        self._clock = clock = clock or LoopClock()
        self._settings = settings
        self._events = events
        self._observer = observer
        self._store = store
        if not store.persistent:
            state.changed = None  # nothing is saved, so nothing to track
        # Nodes whose changed records the save under way carries, until it is durable.
        self._unsaved_nodes: set[int] = set()
        self._ranges = RangeCache()
        self._committer = GroupCommitter(store, state.run_id, self._snapshot,
                                         on_durable=self._publish)
        self._timer_wake = asyncio.Event()
        # Connection attempts to reported peers under way at once, at most: a burst of reports
        # must not exhaust this process's file descriptors (which would fail every probe).
        self._probes = asyncio.Semaphore(MAX_CONCURRENT_PROBES)
        # Members that report each other unreachable while this process reaches both.
        self._partitions = partition.PartitionReports()
        # The timer sleeps while nothing is due: the first node heard from wakes it.
        self._liveness = Liveness(on_first=self._timer_wake.set)
        self._watch_loss = WatchLoss(settings.watch_loss_grace)
        self._intervals = BeatIntervals()
        # Newcomers whose join reply went out, until their first beat: what ends their hold.
        self._first_beats: dict[int, list[_ReplyHold]] = {}  # the holds a beat ends
        now = clock.now()
        for node_id in state.nodes:
            self._liveness.touch(node_id, now)
        # Until then (clock time) nobody is timed out: the clients of a restarted orchestrator
        # or of a new leader are reconnecting.
        self._grace_until = now + settings.reload_grace if state.nodes else None
        now = time.monotonic()
        # Members that have not yet seen the current generation; None once all have.
        self._unacked: set[int] | None = (set(state.members) if state.phase == Phase.ACTIVE
                                          else None)
        self._forming_since = now
        self._formed_ticket = 0
        self._last_call_at: float | None = None
        # Bumped by every commit.
        self._version = 0
        # Nodes queued since the last commit: a call commits the nodes it queued once.
        self._queued = 0
        # While a batch of joins enters: whether a generation forms is decided once, after.
        self._forming_deferred = False
        # The state's member map, its copy that memberships share, and the chief.
        self._shared_members: tuple[dict[int, str], dict[int, str], int] | None = None
        # What watchers see: the update of the last durable save, and a count of them.
        self._published = self.update()
        self._published_version = 0
        self._saving: MembershipUpdate | None = None
        self._watch_wake = asyncio.Event()
        self._join_wake = Wake()
        self._timer: asyncio.Task | None = None
        self._closed = False
        # Since when the run has had no live node (None: it has one); see idle_for.
        self._idle_since: float | None = None
        self._note_idleness()

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Starts the failure detector and timers; call on the event loop."""
        self._start_timer()
        self._maybe_form()
        self._report_membership()

    def _start_timer(self) -> None:
        """Starts the timer loop unless it runs (it ends when the run ends) or the run halted."""
        if not self._closed and (self._timer is None or self._timer.done()):
            self._timer = asyncio.get_running_loop().create_task(self._timer_loop())

    def halt(self) -> None:
        """Stops deciding at once: no timer fires from now on (a replica that lost the lead
        must not remove nodes whose streams its own shutdown just broke)."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()

    async def close(self) -> None:
        """Halts, ends the watch streams and waits for the timer and the saves under way."""
        self.halt()
        self._watch_wake = _woken(self._watch_wake)
        if self._timer is not None:
            await asyncio.gather(self._timer, return_exceptions=True)
        await asyncio.gather(self._committer.wait(self._committer.last_ticket),
                             return_exceptions=True)

    def idle_for(self, now: float) -> float:
        """Seconds the run has had no live node (it ended, or all its nodes were removed);
        0 while it has one. An idle run expires (see RendezvousService)."""
        return 0.0 if self._idle_since is None else now - self._idle_since

    # ------------------------------------------------------------------ queries

    @property
    def run_id(self) -> str:
        return self._state.run_id

    @property
    def version(self) -> int:
        return self._version

    @property
    def generation(self) -> int:
        return self._state.generation

    def membership(self, node_id: int | None = None) -> Membership:
        """The current membership. Its member map is one copy per map of the state (which
        replaces its map, never changes it in place), shared by every membership taken from
        it: the N joins a formation releases would otherwise copy N maps of N members."""
        state = self._state
        shared = self._shared_members
        if shared is None or shared[0] is not state.members:
            members = dict(state.members)
            shared = self._shared_members = (state.members, members, min(members, default=-1))
        return Membership(node_id, state.generation, shared[1], shared[2])

    def update(self) -> MembershipUpdate:
        return MembershipUpdate(self.membership(), self._state.phase, self._state.admissible(),
                                self._state.reason)

    def start_afresh_if_ended(self, min_nodes: int, max_nodes: int) -> None:
        """A first join of an ended run is the next job with this run id: it starts a new run.

        A shared orchestrator outlives jobs, and jobs reuse run ids (the default
        is "default"); without this, the first job's end would refuse every later
        one. Nodes left over from a failed run are removed, so they cannot mix
        with the new job; ids and generations keep counting.
        """
        state = self._state
        if not state.phase.ended:
            return
        if state.phase == Phase.COMPLETED and not self._settings.restart_completed:
            raise refusals.job_complete(state)
        for node_id in state.start_afresh(min_nodes, max_nodes, self._settings):
            self._forget(node_id)
        self._unacked = None
        self._last_call_at = None
        self._forming_since = time.monotonic()
        self._note("run_restarted", None, [], state.reason)
        self._commit(wakes_joins=True)
        self._start_timer()

    def check_config(self, min_nodes: int, max_nodes: int) -> None:
        refusals.check_config(self._state, min_nodes, max_nodes)

    # ------------------------------------------------------------------ calls

    async def join_many(self, entries: Sequence[JoinEntry]) -> list[Membership | RendezvousError]:
        """Joins each entry (its own checks, nonce and error, in order): each is answered once
        its node is a member of a generation newer than its ``last_generation``. At about the
        cost of one join: one save and one wait for the generation for them all.
        A launcher joins the nodes of its workers so; at 10,000 nodes a save, a wake-up and a
        timer per node were most of the orchestrator's work of a formation."""
        answers: list[Membership | RendezvousError | None] = [None] * len(entries)
        # entry index -> (node, the generation it must be newer than, its timeout, deadline)
        waits: dict[int, tuple[Node, int, float, float]] = {}
        removals: dict[int, str] = {}
        newcomers = False
        self._forming_deferred = True  # the batch's nodes are queued first, then it decides
        try:
            for index, entry in enumerate(entries):
                try:
                    node, removals[index] = self._enter(entry)
                except RendezvousError as e:
                    answers[index] = e
                    continue
                newcomers |= entry.node_id is None
                waits[index] = (node, entry.last_generation, entry.timeout,
                                time.monotonic() + entry.timeout)
        finally:
            self._forming_deferred = False
        if self._queued:
            self._maybe_form()  # a generation it forms commits the nodes queued
        if self._queued:
            self._commit(wakes_joins=False, urgent=False)
        if newcomers:
            # A new node is answered only once it is durable, so a restart never forgets an id
            # someone was told, nor gives it out again.
            await self._committer.wait(self._committer.last_ticket)
        await self._wait_for_generations(waits, answers)
        for index, removal in removals.items():
            answer = answers[index]
            if removal and isinstance(answer, Membership):
                answers[index] = dataclasses.replace(answer, taken_back_after=removal)
        return answers  # type: ignore[return-value]  # every entry has its answer

    def _enter(self, entry: JoinEntry) -> tuple[Node, str]:
        """A join's steps before its wait: its checks, its node admitted or found again, the
        next generation formed at once if the join ends the current one. Returns the node and
        why it had been removed (a node taken back); the caller commits the nodes it queued."""
        state = self._state
        refusals.check_not_failed(state)
        refusals.check_last_generation(entry.last_generation, state.generation)
        if entry.node_id is None:
            return self._admit_new(entry.address, entry.nonce)[0], ""
        node_id, address = entry.node_id, entry.address
        removal = refusals.removal(state, node_id) if state.was_removed(node_id) else ""
        taken_back = self._take_back(node_id, address, entry.nonce)
        if taken_back is None:
            removal = ""
        node = taken_back or refusals.known_node(state, node_id)
        refusals.check_same_address(node, address)
        self._watch_loss.heard(node_id)  # its join holds it alive from here on
        step = state.join_step(node_id, entry.last_generation)
        if step is JoinStep.GROW:
            self._form(state.next_members(),
                       f"node {node_id} re-joined generation {state.generation}")
        elif step is JoinStep.ENQUEUE:
            self._enqueue(node)
        return node, removal

    def _take_back(self, node_id: int, address: str, nonce: str) -> Node | None:
        """A removed node whose process was alive all along joins again: it waits to be admitted
        like a newcomer, warm, with its id (see RunState.take_back)."""
        state = self._state
        if not state.was_removed(node_id) or node_id not in state.returnable:
            return None
        state.blocklist.check(address)
        cause = state.removal_cause(node_id)
        node = state.take_back(node_id, address, nonce)
        if node is not None:
            self._liveness.touch(node_id, self._clock.now())
            self._enqueue(node, f"came back after it was removed ({cause}); waiting, address "
                                f"{address}")
        return node

    async def register(self, address: str, nonce: str) -> int:
        """Gives a node its permanent id without queueing it; it joins later with that id."""
        state = self._state
        refusals.check_not_failed(state)
        node, new = self._admit_new(address, nonce, enqueue=False)
        await self._committer.wait(self._save(urgent=False) if new else self._committer.last_ticket)
        refusals.check_not_failed(state)
        return node.node_id

    def heartbeat(self, node_id: int, generation: int) -> HeartbeatInfo:
        state = self._state
        refusals.check_heartbeat(state, node_id, generation)
        if self._first_beats:
            for hold in self._first_beats.pop(node_id, ()):
                hold.release()
        self._heard(node_id)
        member = state.is_active_member(node_id)
        if member and generation == state.generation:
            self._ack(node_id)
        return HeartbeatInfo(generation=state.generation, state=state.phase,
                             waiting=state.admissible(), removed=state.removed_since(generation),
                             member=member, queued=len(state.waiting))

    async def watch(self, node_id: int | None = None) -> AsyncIterator[MembershipUpdate]:
        """Yields the current membership, then the latest one after each change.

        Bursts of changes coalesce into one update, so a slow watcher never
        falls behind. Ends after the run fails. A member's broken stream is a
        hint that its process is gone (see :class:`WatchLoss`).
        """
        if node_id is not None:
            self._watch_loss.opened(node_id)
        try:
            sent = -1
            while not self._closed:
                wake = self._watch_wake
                if self._published_version != sent:
                    sent, update = self._published_version, self._published
                    yield update
                    if update.state.ended:
                        return
                    continue
                await wake.wait()
        finally:
            if node_id is not None and self._watch_loss.closed(
                    node_id, self._clock.now(), self._state.is_active_member(node_id)):
                self._timer_wake.set()

    async def report_failure(self, node_id: int, generation: int, peers: list[int],
                             reason: str) -> tuple[list[int], list[int]]:
        """Checks the reported peers; removes those confirmed dead. Returns (confirmed, alive).

        A report made in an ended generation still counts for the peers that
        are members now: a member that died while the others re-formed is
        removed at once, not at its heartbeat timeout. The orchestrator's own
        probe decides, so a stale reporter cannot remove a live node.

        A node that reports only itself is dead: its agent saw its process
        exit. It is removed at once, member, waiting or registered alike, with
        no probe (its port may already belong to its replacement).
        """
        if peers == [node_id]:
            return await self._remove_dead(node_id, reason)
        peers = refusals.peers_to_probe(self._state, node_id, generation, peers)
        members = self._state.members
        self._heard(node_id)
        verdicts = await asyncio.gather(*(self._is_dead(peer, members[peer]) for peer in peers))
        dead = [peer for peer, is_dead in zip(peers, verdicts) if is_dead]
        alive = [peer for peer, is_dead in zip(peers, verdicts) if not is_dead]
        # The state may have moved on while probing: remove only current members.
        dead_now = [peer for peer in dead if peer in self._state.members]
        if dead_now:
            await self._committer.wait(self._remove(
                dead_now, f"reported by node {node_id}: {reason or 'unreachable'}", failed=True,
                may_return=True))
        elif (alive and generation == self._state.generation
              and self._state.is_active_member(node_id)):
            await self._leave_partition(node_id, generation, alive)
        return dead, alive

    async def _leave_partition(self, node_id: int, generation: int, alive: list[int]) -> None:
        """Removes the side partition.who_leaves picks once two live members reported each
        other, and blocks its address for the cooldown (it would hang the job again at once)."""
        self._partitions.add(generation, node_id, alive)
        state = self._state
        leaving = partition.who_leaves(self._partitions, state.generation, set(state.members))
        if not leaving:
            return
        pairs = sorted({tuple(sorted(p)) for p in self._partitions.unreachable})
        addresses = [state.members[leaver] for leaver in leaving]
        ticket = self._remove(leaving, f"a partition: members {pairs} cannot reach each other "
                              f"(each reaches the orchestrator); {leaving} leave(s)",
                              failed=True, may_return=True)
        for address in addresses:
            state.blocklist.hold(address)
        await self._committer.wait(ticket)

    async def gather(self, kind: str, name: str, node_id: int, generation: int, value: bytes,
                     timeout: float) -> dict[int, bytes]:
        """Barrier and exchange: returns every member's value once all have put theirs."""
        state = self._state
        refusals.check_member(state, node_id, generation)
        self._heard(node_id)
        self._ack(node_id)
        key = f"{kind}/{name}"
        deadline = time.monotonic() + timeout
        refusals.check_gather_room(state, key, generation, self._settings.max_gathers)
        gathers = state.gathers
        if gathers.put(key, node_id, value, state.members.keys()):
            gathers.saved_as(key, self._save())
        while (values := gathers.result(key)) is None:
            refusals.check_member(state, node_id, generation, waiting_for=f"{kind} {name!r}")
            refusals.check_job_not_finished(state, generation, f"{kind} {name!r}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._check_leading(f"remove the members missing from {kind} {name!r}")
                self._remove_missing(kind, name, generation, timeout)
                continue  # this member now finds its generation ended
            await _wait(gathers.changed(key), remaining)
        # Everyone answers only after the result is durable: after a restart, a member
        # that retries finds it instead of waiting for members that already moved on.
        await self._committer.wait(gathers.save_ticket(key))
        refusals.check_member(state, node_id, generation)
        return dict(values)

    def _remove_missing(self, kind: str, name: str, generation: int, timeout: float) -> None:
        """A barrier or exchange timed out: the members that never arrived are removed (they may
        be hung while their heartbeats go on) and the others re-form without them.

        They may come back: a member that recovers joins again like a newcomer.
        """
        missing = refusals.missing_from_gather(self._state, kind, name, generation, timeout)
        cause = (f"it did not reach {kind} {name!r} of generation {generation} within "
                 f"{timeout:g} s while the others waited (hung, or far too slow)")
        self._remove(missing, cause, failed=True, may_return=True)

    async def _remove_dead(self, node_id: int, reason: str) -> tuple[list[int], list[int]]:
        if not self._state.was_removed(node_id):
            refusals.check_not_failed(self._state)
            refusals.known_node(self._state, node_id)
            await self._committer.wait(self._remove(
                [node_id], f"its process died: {reason or 'reported by its agent'}", failed=True))
        return [node_id], []

    async def leave(self, node_id: int, reason: str, job_finished: bool = False) -> None:
        """``job_finished``: the node finished training (see RunState.job_finished)."""
        if self._state.was_removed(node_id):
            return
        refusals.check_not_failed(self._state)
        refusals.known_node(self._state, node_id)
        await self._committer.wait(self._remove(
            [node_id], f"left: {reason or 'no reason given'}", failed=False,
            job_finished=job_finished))

    def status(self) -> RunStatus:
        now = self._clock.now()
        state = self._state
        nodes = [NodeStatus(node_id, state.members[node_id], "member",
                            self._liveness.silent_for(node_id, now))
                 for node_id in sorted(state.members)]
        nodes += [NodeStatus(node_id, state.waiting[node_id].address, "waiting",
                             self._liveness.silent_for(node_id, now))
                  for node_id in sorted(state.waiting)]
        # Standby nodes (an id, not yet asking to join): their agents find their ids here too.
        nodes += [NodeStatus(node_id, state.nodes[node_id].address, "registered",
                             self._liveness.silent_for(node_id, now))
                  for node_id in sorted(state.registered())]
        return RunStatus(state.run_id, state.min_nodes, state.max_nodes, state.phase,
                         state.reason, self.membership(), nodes, list(state.history),
                         state.blocklist.blocked())

    # --------------------------------------------------------------- internals

    def _admit_new(self, address: str, nonce: str, enqueue: bool = True) -> tuple[Node, bool]:
        """Gives a new node its permanent id, or finds it again for a join retried with its
        nonce. Returns the node and whether it is new: the caller saves it and answers only
        once the save is durable.

        The node is recorded at once, so concurrent joins with one nonce get one node.
        """
        state = self._state
        known = state.nonces.get(nonce) if nonce else None
        if known is not None:
            node = refusals.known_node(state, known)
            refusals.check_nonce_address(node, nonce, address)
            return node, False
        state.blocklist.check(address)
        node = state.register(address, nonce)
        self._liveness.touch(node.node_id, self._clock.now())
        if enqueue:
            self._enqueue(node)
        else:
            self._log(ev.NODE_JOINED, node.node_id, [node.node_id],
                      f"registered, address {address}", address=address)
        return node, True

    def _enqueue(self, node: Node, detail: str = "") -> None:
        """Puts a node in the waiting queue: the next generation admits it. The caller commits
        (once for the nodes of a call)."""
        self._state.enqueue(node)
        self._queued += 1
        self._log(ev.NODE_JOINED, node.node_id, [node.node_id],
                  detail or f"waiting, address {node.address}", address=node.address)
        if not self._forming_deferred:
            self._maybe_form()

    async def _wait_for_generations(self, waits: dict[int, tuple[Node, int, float, float]],
                                    answers: list[Membership | RendezvousError | None]) -> None:
        """Waits until each node of ``waits`` (entry index -> node, the generation it must be
        newer than, timeout, deadline) is a member of a newer generation, or its join fails; puts each
        answer at its index. The nodes are held alive meanwhile, and all wait on one wake-up."""
        self._liveness.hold_all([node.node_id for node, *_ in waits.values()])
        try:
            while waits:
                formed = self._formed(waits, answers)
                if formed:
                    await self._committer.wait(self._formed_ticket)
                    self._answer_formed(waits, formed, answers)
                elif waits:
                    soonest = min(wait[3] for wait in waits.values())
                    await self._join_wake.wait(soonest - time.monotonic())
        finally:
            for node, *_ in waits.values():
                self._stop_holding(node.node_id)

    def _formed(self, waits: dict[int, tuple[Node, int, float, float]],
                answers: list[Membership | RendezvousError | None]) -> list[int]:
        """The entries of ``waits`` whose node is a member of a generation newer than the one
        it waits past. A join that fails (the run failed or completed, its node was removed,
        its deadline passed) gets its error and leaves ``waits``. One pass over a batch: at a
        formation thousands of nodes are answered at once."""
        state = self._state
        ended: RendezvousError | None = None
        try:
            refusals.check_not_failed(state)
        except RendezvousError as e:
            ended = e
        if ended is None and (state.phase == Phase.COMPLETED or state.job_finished):
            ended = refusals.job_complete(state)
        formed = []
        members = state.members if state.phase == Phase.ACTIVE else {}
        generation = state.generation
        now = time.monotonic()
        for index, (node, after, timeout, deadline) in list(waits.items()):
            node_id = node.node_id
            if ended is None:
                if node_id in members and generation > after:
                    formed.append(index)
                    continue
                if state.was_removed(node_id):
                    error = refusals.removed_error(state, node_id)
                elif deadline <= now:
                    error = RendezvousTimeoutError(refusals.join_timeout_message(state, node,
                                                                                 timeout))
                else:
                    continue
            else:
                error = ended
            del waits[index]
            self._stop_holding(node_id)
            answers[index] = error
        return formed

    def _answer_formed(self, waits: dict[int, tuple[Node, int, float, float]],
                       formed: list[int],
                       answers: list[Membership | RendezvousError | None]) -> None:
        """Answers the ``formed`` entries of ``waits`` whose node is still a member (the save
        of their generation is durable) with the current membership, in one pass."""
        state = self._state
        if state.phase != Phase.ACTIVE:
            return  # it changed while saving: the next pass decides
        members = state.members
        answered = []
        for index in formed:
            node_id = waits[index][0].node_id
            if node_id in members:
                del waits[index]
                answered.append(node_id)
                answers[index] = self.membership(node_id)
        self._liveness.release_all(answered, self._clock.now())
        self._ack_all(answered)

    def ask_interval(self, node_ids: Sequence[int]) -> float:
        """The shortest heartbeat interval this run asks of ``node_ids``, whose joins return now
        (their replies say it); their silences are judged by it from now on."""
        interval = beat_interval_floor(len(self._state.nodes))
        self._intervals.ask_all(node_ids, interval)
        return interval

    def heartbeat_timeout(self) -> float:
        """How long a node of this run may stay silent: --heartbeat_timeout, longer when the run
        asked its nodes for slower beats (see liveness_timeout). A node loaded from the store
        was asked at most what the run's size asks now."""
        interval = max(self._intervals.longest, beat_interval_floor(len(self._state.nodes)))
        return liveness_timeout(self._settings.heartbeat_timeout, interval)

    def hold_while_answering(self, nodes: Sequence[tuple[int, bool]]) -> Callable[[], None]:
        """Counts the ``nodes`` (node id, newcomer) of one reply alive until the returned
        function is called (at the latest after REPLY_HOLD_MAX_S): their join replies are on
        their way, and a node learns its id, so can beat, only from its reply. Called as soon
        as the joins returned, a node's silence starts when its reply has been sent, not when
        the thousands of replies of a formation were queued together. A newcomer (whose beats
        start with this reply) stays held until its first beat, at most FIRST_BEAT_MAX_S
        longer: the beat streams of a large formation open together, and their first beats are
        read seconds later. A beat read before the reply's sending was noted (the node got it:
        it beats) ends the hold too. One timer serves the nodes of a reply."""
        loop = asyncio.get_running_loop()
        holds = []
        self._liveness.hold_all([node_id for node_id, _ in nodes])
        for node_id, newcomer in nodes:
            hold = _ReplyHold(node_id, newcomer, self._end_hold)
            if newcomer:  # a join retried with its nonce holds it twice: one beat ends both
                self._first_beats.setdefault(node_id, []).append(hold)
            holds.append(hold)
        cap = loop.call_later(REPLY_HOLD_MAX_S, _release, holds)

        def reply_sent() -> None:
            nonlocal cap
            cap.cancel()
            first_beat = []
            for hold in holds:
                if hold.held and hold.newcomer and hold.node_id in self._state.nodes:
                    first_beat.append(hold)
                else:
                    hold.release()
            if first_beat:
                cap = loop.call_later(FIRST_BEAT_MAX_S, _release, first_beat)

        return reply_sent

    def _end_hold(self, hold: _ReplyHold) -> None:
        waiting = self._first_beats.get(hold.node_id)
        if waiting and hold in waiting:
            waiting.remove(hold)
            if not waiting:
                del self._first_beats[hold.node_id]
        self._stop_holding(hold.node_id)

    def _heard(self, node_id: int) -> None:
        """A message from the node: it is alive now."""
        self._liveness.touch(node_id, self._clock.now())
        self._watch_loss.heard(node_id)

    def _forget(self, node_id: int) -> None:
        """A node that left the run: its liveness and the interval it was asked go."""
        self._liveness.forget(node_id)
        self._intervals.forget(node_id)
        self._watch_loss.forget(node_id)

    def _stop_holding(self, node_id: int) -> None:
        self._liveness.release(node_id, self._clock.now())
        if node_id not in self._state.nodes:
            self._forget(node_id)

    # -------------------------------------------------------------- transitions

    def _maybe_form(self) -> None:
        """Forms the first generation (or the next one after falling below min_nodes)."""
        state = self._state
        forming = state.forming()
        if forming is Forming.FULL:
            self._form(state.next_members(), f"max_nodes={state.max_nodes} joined")
        elif forming is Forming.TOO_FEW:
            self._last_call_at = None
        elif forming is Forming.ENOUGH:
            now = time.monotonic()
            if self._last_call_at is None:
                self._last_call_at = now + self._settings.last_call
                self._timer_wake.set()
            if now >= self._last_call_at:
                self._form(state.next_members(), "the last call ended")

    def _form(self, ids: list[int], cause: str) -> None:
        ids = self._state.form(ids, cause)
        self._last_call_at = None
        self._unacked = set(ids)
        self._log(ev.GENERATION_START, None, ids, cause, members=ids, world_size=len(ids))
        self._formed_ticket = self._commit(wakes_joins=True)

    def _ack(self, node_id: int) -> None:
        """Notes that a member knows the current generation; once all do, the rendezvous is
        complete."""
        self._ack_all((node_id,))

    def _ack_all(self, node_ids: Sequence[int]) -> None:
        """:meth:`_ack` for each of ``node_ids``."""
        if self._unacked is None:
            return
        self._unacked.difference_update(node_ids)
        if not self._unacked:
            self._unacked = None
            seconds = time.monotonic() - self._forming_since
            self._forming_since = time.monotonic()
            ids = sorted(self._state.members)
            self._log(ev.RENDEZVOUS_COMPLETE, None, ids, f"{len(ids)} members know generation "
                      f"{self._state.generation}", members=ids, world_size=len(ids),
                      duration_s=round(seconds, 6))
            self._observer.rendezvous_done(self._state.run_id, seconds)

    def _remove(self, ids: list[int], cause: str, failed: bool, may_return: bool = False,
                job_finished: bool = False) -> int:
        """Removes nodes and re-forms if members were lost; returns the save ticket.

        ``may_return``: they were only silent or unreachable, so their processes may come back.
        """
        state = self._state
        removal = state.remove(ids, cause, failed, may_return, job_finished)
        for node_id in removal.removed:
            self._forget(node_id)
            self._log(ev.NODE_LEFT, node_id, [node_id], cause, reason=cause)
        lost = removal.lost
        if failed and lost:
            self._log(ev.FAILURE_DETECTED, None, lost, cause, failed=lost, cause=cause)
        if removal.next is AfterRemoval.COMPLETE:
            self._complete(ids, cause)
        elif removal.next is AfterRemoval.MAYBE_FORM:
            self._maybe_form()
        elif removal.next is AfterRemoval.FINISHING:
            pass  # the other members leave in turn: the last one completes the run
        else:
            self._forming_since = time.monotonic()
            if removal.next is AfterRemoval.RE_FORM:
                self._form(state.next_members(lost), f"lost {lost}: {cause}")
            else:
                self._fall_below_min(lost, cause)
        return self._commit(wakes_joins=True)

    def _fall_below_min(self, lost: list[int], cause: str) -> None:
        state = self._state
        fail_at = time.monotonic() + self._settings.below_min_timeout
        survivors = state.fall_below_min(lost, cause, fail_at)
        self._note("below_min", None, survivors, state.reason)
        self._timer_wake.set()

    def _complete(self, last: list[int], cause: str) -> None:
        """Ends the run when its last node left of its own accord (see RunState.complete)."""
        self._state.complete(last, cause)
        self._last_call_at = None
        self._unacked = None
        self._note("run_completed", None, last, self._state.reason)

    def _fail(self, reason: str) -> None:
        state = self._state
        state.fail(reason)
        self._log(ev.FAILURE_DETECTED, None, sorted(state.waiting), reason, failed=[],
                  cause=reason, fatal=True)
        self._commit(wakes_joins=True)

    def _commit(self, wakes_joins: bool, urgent: bool = True) -> int:
        """The exit of every state transition: saves the state (at once if ``urgent``, see
        GroupCommitter.mark), wakes the waiting joins (when the transition can decide them)
        and tells the observer; the watch streams hear of it once it is durable (see
        _publish).

        Returns the save's ticket, for callers that answer only once it is durable.
        """
        ticket = self._save(urgent)
        self._queued = 0
        self._version += 1
        if wakes_joins:
            self._join_wake.wake()
        self._report_membership()
        return ticket

    def _save(self, urgent: bool = True) -> int:
        """Saves a change that no watcher sees (an id given out, a completed gather)."""
        self._note_idleness()
        return self._committer.mark(urgent)

    def _snapshot(self) -> Snapshot:
        """The state to save; the update it holds goes to the watchers once it is durable."""
        self._saving = self.update()
        self._unsaved_nodes |= self._state.take_changed()
        return encode(self._state, self._unsaved_nodes, self._ranges)

    def _publish(self) -> None:
        """A save is durable: the watch streams get the update it holds (with a store that
        keeps nothing, the update now). A replica cut off from its store never gets here, so
        it tells no one of a change that the next leader will not know."""
        update, self._saving = self._saving or self.update(), None
        self._unsaved_nodes = set()
        if update != self._published:
            self._published = update
            self._published_version += 1
            self._watch_wake = _woken(self._watch_wake)

    def _check_leading(self, what: str) -> None:
        """Raises NotLeaderError when this replica may not decide now (its lead ran out)."""
        if not self._store.leading:
            raise NotLeaderError(f"this orchestrator replica's lead ran out; it cannot {what}: "
                                 f"call the leading replica")

    def _note_idleness(self) -> None:
        if not (self._state.phase.ended or not self._state.nodes):
            self._idle_since = None
        elif self._idle_since is None:
            self._idle_since = time.monotonic()

    def _report_membership(self) -> None:
        state = self._state
        self._observer.membership_changed(state.run_id, state.generation, len(state.members),
                                          len(state.waiting))

    def _log(self, event: str, node: int | None, nodes: list[int], detail: str,
             **fields: Any) -> None:
        """Records a change in the run's history (``status`` shows it) and in the event log."""
        self._note(event, node, nodes, detail)
        self._events.record(event, node=node, generation=self._state.generation,
                            run_id=self._state.run_id, **fields)

    def _note(self, event: str, node: int | None, nodes: list[int], detail: str) -> None:
        """Records a change in the run's history only."""
        self._state.note(event, nodes if node is None else [node], detail, time.time())

    # -------------------------------------------------------------- timers

    async def _is_dead(self, peer: int, address: str) -> bool:
        """A reported peer is dead if it went quiet for half the heartbeat timeout, or if its
        address refuses a connection or stays silent while this process keeps up. A local
        failure (no file descriptors, no buffers) or a timeout this process's own stall may
        explain says nothing of the peer: it stays, and its heartbeats decide."""
        silent = self._liveness.silent_for(peer, self._clock.now())
        if silent > self.heartbeat_timeout() / 2:
            return True
        async with self._probes:
            return await probe(address, self._settings.probe_timeout) is Probe.DEAD

    async def _timer_loop(self) -> None:
        """Failure detector, last call and below-min deadline, sleeping until the next is due."""
        clock = self._clock
        fenced = False
        while not self._state.phase.ended:
            alive_now = clock.now()
            now = time.monotonic()
            if not self._store.leading:
                # A replica whose lead ran out decides nothing: a new leader may already have.
                fenced = True
                await asyncio.sleep(_FENCED_RECHECK_S)
                continue
            if fenced:  # its refusals kept every node from being heard meanwhile
                for node_id in self._state.nodes:
                    self._liveness.touch(node_id, alive_now)
                fenced = False
            self._on_timers(now, alive_now)
            due = []  # on the loop clock, then on time.monotonic()
            oldest = self._liveness.oldest()
            if self._grace_until is not None:
                due.append(self._grace_until)
            elif oldest is not None:
                due.append(oldest[1] + self.heartbeat_timeout())
            if self._state.phase == Phase.ACTIVE:
                due += self._watch_loss.deadlines()
            due = [clock.to_monotonic(t) for t in due]
            due += [t for t in (self._last_call_at, self._state.below_min_at) if t is not None]
            self._timer_wake.clear()
            await _wait(self._timer_wake, max(0.0, min(due) - now) + 0.001 if due else None)

    def _on_timers(self, now: float, alive_now: float) -> None:
        """Acts on what is due: ``now`` is time.monotonic(), ``alive_now`` the loop clock's."""
        settings = self._settings
        if self._grace_until is not None and alive_now >= self._grace_until:
            self._grace_until = None
        if self._grace_until is None:
            timeout = self.heartbeat_timeout()
            silent = self._liveness.expired(alive_now, timeout)
            if silent:
                self._remove(silent, f"no heartbeat for {timeout:g} s",
                             failed=True, may_return=True)
        if self._state.phase == Phase.ACTIVE:
            gone = self._watch_loss.overdue(alive_now, self._state.members)
            if gone:
                self._remove(gone, f"its connection closed and it sent nothing for "
                             f"{settings.watch_loss_grace:g} s", failed=True, may_return=True)
        if self._state.below_min_expired(now):
            self._fail(f"{self._state.reason}, and not enough nodes came back within "
                       f"{settings.below_min_timeout:g} s (--below_min_timeout); restart "
                       f"the job with enough nodes")
        elif self._last_call_at is not None and now >= self._last_call_at:
            self._maybe_form()


class _ReplyHold:
    """A node held alive by the join reply on its way to it (see Run.hold_while_answering)."""

    __slots__ = ("node_id", "newcomer", "held", "_end")

    def __init__(self, node_id: int, newcomer: bool, end: Callable[[_ReplyHold], None]):
        self.node_id = node_id
        self.newcomer = newcomer
        self.held = True
        self._end = end

    def release(self) -> None:
        if self.held:
            self.held = False
            self._end(self)


def _release(holds: list[_ReplyHold]) -> None:
    for hold in holds:
        hold.release()


def _woken(event: asyncio.Event) -> asyncio.Event:
    """Wakes everyone waiting on ``event``; returns a fresh event for the next wait."""
    event.set()
    return asyncio.Event()


async def _wait(event: asyncio.Event, timeout: float | None) -> None:
    """Waits for ``event`` at most ``timeout`` seconds (None: no limit); the caller re-checks
    its condition."""
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except asyncio.TimeoutError:
        pass
