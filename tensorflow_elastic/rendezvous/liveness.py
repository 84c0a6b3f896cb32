"""Which nodes have gone silent, in O(1) per heartbeat.

Nodes sit in an ordered dict from least to most recently heard; a heartbeat
moves its node to the end. The first entry is therefore the next to expire, so
the failure detector sleeps exactly until then instead of scanning every node.
A node blocked in a call that is held open (a join waiting for its generation)
is alive by definition and leaves the order until the call ends.
"""

from __future__ import annotations

import collections


class Liveness:
    def __init__(self) -> None:
        self._last_seen: collections.OrderedDict[int, float] = collections.OrderedDict()
        self._held: collections.Counter[int] = collections.Counter()

    def touch(self, node_id: int, now: float) -> None:
        if self._held[node_id]:
            return
        self._last_seen[node_id] = now
        self._last_seen.move_to_end(node_id)

    def hold(self, node_id: int) -> None:
        """Counts the node alive until the matching :meth:`release`."""
        self._held[node_id] += 1
        self._last_seen.pop(node_id, None)

    def release(self, node_id: int, now: float) -> None:
        self._held[node_id] -= 1
        if self._held[node_id] <= 0:
            del self._held[node_id]
            self.touch(node_id, now)

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
