"""Keeps addresses that fail again and again out of a run for a while.

A flaky machine that joins, fails and rejoins makes every member re-form each
time. After ``after`` failures an address is blocked for ``cooldown`` seconds,
doubling with each further failure up to ``max_cooldown`` (the exponential
cooldown of elastic drivers). Times are wall-clock so they survive a restart.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from tensorflow_elastic.rendezvous.errors import BlocklistedError


@dataclasses.dataclass
class _Entry:
    failures: int = 0
    until: float = 0.0


class Blocklist:
    def __init__(self, after: int, cooldown: float, max_cooldown: float):
        self.after = after
        self.cooldown = cooldown
        self.max_cooldown = max_cooldown
        self._entries: dict[str, _Entry] = {}

    def record_failure(self, address: str, now: float | None = None) -> float:
        """Counts one failure of ``address``; returns how long it is now blocked (0 if not)."""
        now = time.time() if now is None else now
        entry = self._entries.setdefault(address, _Entry())
        entry.failures += 1
        if entry.failures < self.after:
            return 0.0
        seconds = self._cooldown_s(entry.failures)
        entry.until = now + seconds
        return seconds

    def hold(self, address: str, now: float | None = None) -> float:
        """Blocks ``address`` now, as if it had reached ``after`` failures (a failure sure to
        repeat as soon as it comes back: a partition); returns for how long."""
        now = time.time() if now is None else now
        entry = self._entries.setdefault(address, _Entry())
        entry.failures = max(entry.failures, self.after)
        seconds = self._cooldown_s(entry.failures)
        entry.until = max(entry.until, now + seconds)
        return seconds

    def _cooldown_s(self, failures: int) -> float:
        return min(self.cooldown * 2 ** (failures - self.after), self.max_cooldown)

    def check(self, address: str, now: float | None = None) -> None:
        """Raises :class:`BlocklistedError` while ``address`` cools down."""
        now = time.time() if now is None else now
        entry = self._entries.get(address)
        if entry is not None and entry.until > now:
            raise BlocklistedError(
                f"address {address} failed {entry.failures} times and is blocked for "
                f"{entry.until - now:.0f} s more; fix or replace that machine, or join from "
                f"another address")

    def blocked(self, now: float | None = None) -> list[tuple[str, int, float]]:
        """(address, failures, seconds remaining) of the addresses blocked now."""
        now = time.time() if now is None else now
        return [(address, e.failures, e.until - now)
                for address, e in sorted(self._entries.items()) if e.until > now]

    def snapshot(self) -> dict[str, Any]:
        return {address: [e.failures, e.until] for address, e in self._entries.items()}

    def restore(self, data: dict[str, Any]) -> None:
        self._entries = {address: _Entry(int(f), float(u)) for address, (f, u) in data.items()}
