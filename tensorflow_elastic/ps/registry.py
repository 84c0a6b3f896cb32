"""Which workers the PS knows, leases that find the silent ones, and secrets that prove who is who.

Ids are small integers handed out in order and never reused, also across a
PS restart (the next id is part of the checkpoint), so events and stats can
name a worker unambiguously. Being guessable, an id alone proves nothing: each
registration hands out a random secret, and a call for a live worker without
its secret (e.g. a ``Leave(finished)`` that would end the job) raises
:class:`NotTheWorker`.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from typing import Callable


class NotTheWorker(Exception):
    """A call named a live worker but did not carry the secret it was registered with."""


class WorkerRegistry:
    def __init__(self, lease_timeout: float, clock: Callable[[], float] = time.monotonic):
        if lease_timeout <= 0:
            raise ValueError(f"lease_timeout must be > 0, got {lease_timeout}")
        self.lease_timeout = lease_timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._last_seen: dict[str, float] = {}
        self._secrets: dict[str, str] = {}
        self._next_id = 0
        self.finished = 0

    def register(self, worker_id: str = "", secret: str = "") -> tuple[str, str, bool]:
        """(id, secret, is_new); an empty id gets a fresh one, an earlier id comes back, a live
        id only with its secret (NotTheWorker otherwise)."""
        with self._lock:
            if not worker_id:
                worker_id = str(self._next_id)
            if worker_id.isdigit():
                self._next_id = max(self._next_id, int(worker_id) + 1)
            is_new = worker_id not in self._last_seen
            if is_new:
                self._secrets[worker_id] = secrets.token_hex(16)
            else:
                self._check_secret(worker_id, secret)
            self._last_seen[worker_id] = self._clock()
            return worker_id, self._secrets[worker_id], is_new

    def _check_secret(self, worker_id: str, secret: str) -> None:
        if not hmac.compare_digest(secret.encode(), self._secrets[worker_id].encode()):
            raise NotTheWorker(f"worker {worker_id!r} is registered by another caller; a worker "
                               f"sends the secret it got from Register with every call")

    def touch(self, worker_id: str, secret: str) -> bool:
        """Renews a lease; False for a worker the PS does not know (it must register)."""
        with self._lock:
            if worker_id not in self._last_seen:
                return False
            self._check_secret(worker_id, secret)
            self._last_seen[worker_id] = self._clock()
            return True

    def remove(self, worker_id: str, secret: str, finished: bool = False) -> bool:
        """Forgets a worker that says goodbye; False when it was not live."""
        with self._lock:
            if worker_id not in self._last_seen:
                return False
            self._check_secret(worker_id, secret)
            del self._last_seen[worker_id], self._secrets[worker_id]
            if finished:
                self.finished += 1
            return True

    def expired(self) -> list[str]:
        """Removes and returns the workers silent for longer than the lease."""
        now = self._clock()
        with self._lock:
            gone = [w for w, seen in self._last_seen.items() if now - seen > self.lease_timeout]
            for worker_id in gone:
                del self._last_seen[worker_id], self._secrets[worker_id]
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
