"""Which nodes have gone silent, in O(1) per heartbeat, and which members lost their watch.

Nodes sit in an ordered dict from least to most recently heard; a heartbeat
moves its node to the end. The first entry is therefore the next to expire, so
the failure detector sleeps exactly until then instead of scanning every node.
A node blocked in a call that is held open (a join waiting for its generation)
is alive by definition and leaves the order until the call ends, and until its
reply has been sent: a node learns its id from it, so cannot beat before. A
newcomer stays out of the order until its first beat: the beat streams of a
large formation open together, and their first beats are read seconds later.

A broken watch stream is the quicker sign: see :class:`WatchLoss`. Silence is
measured on a :class:`LoopClock`, which leaves out the time the serving loop
itself stood still.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Callable, Container, Iterable

# How often the loop clock checks that the serving loop runs, and how late a check may be
# before the delay counts as a stall (scheduling jitter under load is not one).
LOOP_TICK_S = 0.1
LOOP_STALL_TOLERANCE_S = 0.1
# A join reply not sent after this long (its peer stopped reading) no longer keeps its node alive.
REPLY_HOLD_MAX_S = 30.0
# A newcomer whose reply went out and that has not beaten yet counts as alive this long at most
# (a host that vanished right after its join is removed then; a dead process sooner, by its
# agent's report or its broken watch).
FIRST_BEAT_MAX_S = 10.0


class LoopClock:
    """time.monotonic() minus the stalls of the event loop that serves the nodes.

    While the loop stands still (a GC pause, a synchronous load, a frozen
    process) no heartbeat can be read, however alive the nodes are: that time
    is nobody's silence. :meth:`tick` runs on the loop every LOOP_TICK_S; any
    reading that finds the last one far older than that counts the difference
    as a stall, so the first code to run after a stall (a timer or a queued
    heartbeat) already reads the corrected time.
    """

    def __init__(self, monotonic: Callable[[], float] = time.monotonic):
        self._monotonic = monotonic
        self._last = monotonic()
        self._stalled = 0.0

    def now(self) -> float:
        now = self._monotonic()
        gap = now - self._last
        if gap > LOOP_TICK_S + LOOP_STALL_TOLERANCE_S:
            self._stalled += gap - LOOP_TICK_S
        self._last = now
        return now - self._stalled

    @property
    def stalled(self) -> float:
        """Seconds the loop stood still in all, as far as measured."""
        return self._stalled

    def to_monotonic(self, t: float) -> float:
        """A time of this clock on time.monotonic(), at the stalls measured so far."""
        return t + self._stalled

    async def tick(self) -> None:
        """Reads the clock every LOOP_TICK_S until cancelled."""
        while True:
            await asyncio.sleep(LOOP_TICK_S)
            self.now()


class Liveness:
    def __init__(self, on_first: Callable[[], None] = lambda: None) -> None:
        """``on_first`` is called when a node is heard from while none could expire: a timer
        that slept without a deadline must wake and set one."""
        self._on_first = on_first
        self._last_seen: collections.OrderedDict[int, float] = collections.OrderedDict()
        self._held: collections.Counter[int] = collections.Counter()

    def touch(self, node_id: int, now: float) -> None:
        if self._held[node_id]:
            return
        self._seen(node_id, now)

    def _seen(self, node_id: int, now: float) -> None:
        """Heard from ``now`` (the newest of the nodes heard from)."""
        if not self._last_seen:
            self._on_first()
        self._last_seen[node_id] = now
        self._last_seen.move_to_end(node_id)

    def hold(self, node_id: int) -> None:
        """Counts the node alive until the matching :meth:`release`."""
        self.hold_all((node_id,))

    def release(self, node_id: int, now: float) -> None:
        self.release_all((node_id,), now)

    def hold_all(self, node_ids: Iterable[int]) -> None:
        """:meth:`hold` for each of ``node_ids``, in one pass (a formation's thousands)."""
        held, last_seen = self._held, self._last_seen
        for node_id in node_ids:
            held[node_id] += 1
            last_seen.pop(node_id, None)

    def release_all(self, node_ids: Iterable[int], now: float) -> None:
        """:meth:`release` for each of ``node_ids``: heard from ``now`` once its last hold
        ends."""
        held = self._held
        for node_id in node_ids:
            held[node_id] -= 1
            if held[node_id] <= 0:
                del held[node_id]
                self._seen(node_id, now)

    def forget(self, node_id: int) -> None:
        self._last_seen.pop(node_id, None)

    def silent_for(self, node_id: int, now: float) -> float:
        """Seconds since the node was heard from; 0 while a call holds it."""
        last = self._last_seen.get(node_id)
        return 0.0 if last is None else now - last

    def oldest(self) -> tuple[int, float] | None:
        """The (node id, last seen) that expires first, if any."""
        for item in self._last_seen.items():
            return item
        return None

    def expired(self, now: float, timeout: float) -> list[int]:
        """Nodes silent for longer than ``timeout``."""
        silent = []
        for node_id, last in self._last_seen.items():
            if now - last <= timeout:
                break
            silent.append(node_id)
        return silent


class BeatIntervals:
    """The heartbeat intervals a run asked of its nodes (in their join replies), and the
    longest: a node that joined the run at its largest beats slowest, and its silence is judged
    by that interval until it leaves, however the run shrank meanwhile. A node beats at the
    interval of the join that started its beats: a later reply asking a shorter one (the run
    shrank) changes nothing until the node leaves."""

    def __init__(self) -> None:
        self._of: dict[int, float] = {}
        self._count: collections.Counter[float] = collections.Counter()
        self.longest = 0.0

    def ask(self, node_id: int, interval: float) -> None:
        self.ask_all((node_id,), interval)

    def ask_all(self, node_ids: Iterable[int], interval: float) -> None:
        """Asks each of ``node_ids`` for ``interval``; a node keeps the longest it was asked.
        In one pass: a formation asks thousands at once."""
        of = self._of
        changed = 0
        for node_id in node_ids:
            asked = of.get(node_id)
            if asked is not None:
                if asked >= interval:
                    continue
                self.forget(node_id)
            of[node_id] = interval
            changed += 1
        if changed:
            self._count[interval] += changed
            self.longest = max(self.longest, interval)

    def forget(self, node_id: int) -> None:
        interval = self._of.pop(node_id, None)
        if interval is None:
            return
        self._count[interval] -= 1
        if not self._count[interval]:
            del self._count[interval]
            if interval == self.longest:
                self.longest = max(self._count, default=0.0)


class WatchLoss:
    """Members whose last watch stream broke, and since when.

    A process that dies closes its connection, and its watch breaks at once. A
    live one sends its next heartbeat (or watches again) within its heartbeat
    interval; a member that does neither for ``grace`` after its watch broke is
    taken for dead then, not at its heartbeat timeout: members blocked in a
    barrier or a sync with it stop waiting sooner. Only a message counts as
    heard: a hold (a newcomer not yet beating, a call that the dead process left
    open) says nothing about the process since its watch broke.
    """

    def __init__(self, grace: float):
        self._grace = grace
        self._open: collections.Counter[int] = collections.Counter()
        self._lost_at: dict[int, float] = {}

    def opened(self, node_id: int) -> None:
        self._open[node_id] += 1
        self._lost_at.pop(node_id, None)

    def heard(self, node_id: int) -> None:
        """The node sent a message: it is alive, whatever its watch did."""
        if self._lost_at:
            self._lost_at.pop(node_id, None)

    def forget(self, node_id: int) -> None:
        """The node left the run: its lost watch is no longer due."""
        self._lost_at.pop(node_id, None)

    def closed(self, node_id: int, now: float, member: bool) -> bool:
        """Counts a stream that ended; returns True when it starts a member's grace."""
        self._open[node_id] -= 1
        if self._open[node_id] > 0:
            return False
        del self._open[node_id]
        if member:
            self._lost_at[node_id] = now
        return member

    def overdue(self, now: float, members: Container[int]) -> list[int]:
        """Members not heard from for ``grace`` since their watch broke; each is reported
        once."""
        gone = []
        for node_id, lost_at in list(self._lost_at.items()):
            if node_id not in members:
                del self._lost_at[node_id]
            elif now - lost_at >= self._grace:
                del self._lost_at[node_id]
                gone.append(node_id)
        return gone

    def deadlines(self) -> list[float]:
        """When each lost member's grace ends (the timer acts on them only while the run is
        active: see :meth:`overdue`)."""
        return [lost_at + self._grace for lost_at in self._lost_at.values()]
