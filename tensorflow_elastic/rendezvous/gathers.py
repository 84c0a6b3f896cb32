"""Barriers and small exchanges among the members of one generation.

Each member puts a value under a key (a barrier puts an empty one); once every
member has, each of them gets all the values. Completed results stay until the
generation ends, so a member that retries after an orchestrator restart finds
its result instead of waiting for members that already moved on. When the
generation ends, every waiter wakes (to find out it ended) and all is forgotten.
"""

from __future__ import annotations

import asyncio
from typing import AbstractSet


class Gathers:
    def __init__(self, completed: dict[str, dict[int, bytes]] | None = None):
        self._completed: dict[str, dict[int, bytes]] = completed if completed is not None else {}
        self._pending: dict[str, dict[int, bytes]] = {}
        self._events: dict[str, asyncio.Event] = {}
        self._save_tickets: dict[str, int] = {}

    @property
    def completed(self) -> dict[str, dict[int, bytes]]:
        """Values by key and node of every gather that completed in this generation."""
        return self._completed

    def put(self, key: str, node_id: int, value: bytes, members: AbstractSet[int]) -> bool:
        """Adds a member's value; returns True when it was the last one missing.

        A put to a completed gather changes nothing: it is a member's retry.
        """
        if key in self._completed:
            return False
        values = self._pending.setdefault(key, {})
        values[node_id] = value
        if not values.keys() >= members:
            return False
        self._completed[key] = self._pending.pop(key)
        self.changed(key).set()
        return True

    def holds(self, key: str) -> bool:
        return key in self._completed or key in self._pending

    def __len__(self) -> int:
        """How many gathers (pending or completed) this generation holds."""
        return len(self._completed) + len(self._pending)

    def result(self, key: str) -> dict[int, bytes] | None:
        return self._completed.get(key)

    def missing(self, key: str, members: AbstractSet[int]) -> list[int]:
        """Members that have not put a value under ``key`` yet."""
        return sorted(members - self._pending.get(key, {}).keys())

    def changed(self, key: str) -> asyncio.Event:
        """Set when the gather under ``key`` completes or the generation ends."""
        return self._events.setdefault(key, asyncio.Event())

    def saved_as(self, key: str, ticket: int) -> None:
        """Notes the save that makes a completed result durable: members are answered after it."""
        self._save_tickets[key] = ticket

    def save_ticket(self, key: str) -> int:
        """The save to wait for before answering; 0 for a result loaded from a snapshot."""
        return self._save_tickets.get(key, 0)

    def end(self) -> None:
        """The generation ended: wakes every waiter and forgets every gather."""
        for event in self._events.values():
            event.set()
        self._completed.clear()
        self._pending.clear()
        self._events.clear()
        self._save_tickets.clear()
