"""Which workers the PS knows, and leases that find the silent ones.

Ids are small integers handed out in order and never reused, also across a
PS restart (the next id is part of the checkpoint), so events and stats can
name a worker unambiguously.
"""

from __future__ import annotations

import threading
import time
from typing import Callable


class WorkerRegistry:
    def __init__(self, lease_timeout: float, clock: Callable[[], float] = time.monotonic):
        if lease_timeout <= 0:
            raise ValueError(f"lease_timeout must be > 0, got {lease_timeout}")
        self.lease_timeout = lease_timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._last_seen: dict[str, float] = {}
        self._next_id = 0
        self.finished = 0

    def register(self, worker_id: str = "") -> tuple[str, bool]:
        """(id, is_new); an empty id gets a fresh one, a known or earlier id comes back."""
        with self._lock:
            if not worker_id:
                worker_id = str(self._next_id)
            if worker_id.isdigit():
                self._next_id = max(self._next_id, int(worker_id) + 1)
            is_new = worker_id not in self._last_seen
            self._last_seen[worker_id] = self._clock()
            return worker_id, is_new

    def touch(self, worker_id: str) -> bool:
        """Renews a lease; False for a worker the PS does not know (it must register)."""
        with self._lock:
            if worker_id not in self._last_seen:
                return False
            self._last_seen[worker_id] = self._clock()
            return True

    def remove(self, worker_id: str, finished: bool = False) -> bool:
        with self._lock:
            known = self._last_seen.pop(worker_id, None) is not None
            if known and finished:
                self.finished += 1
            return known

    def expired(self) -> list[str]:
        """Removes and returns the workers silent for longer than the lease."""
        now = self._clock()
        with self._lock:
            gone = [w for w, seen in self._last_seen.items() if now - seen > self.lease_timeout]
            for worker_id in gone:
                del self._last_seen[worker_id]
            return gone

    def live(self) -> list[str]:
        with self._lock:
            return sorted(self._last_seen, key=lambda w: (len(w), w))

    @property
    def next_id(self) -> int:
        return self._next_id

    @next_id.setter
    def next_id(self, value: int) -> None:
        with self._lock:
            self._next_id = max(self._next_id, value)
