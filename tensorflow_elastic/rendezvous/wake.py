"""A wake-up that thousands of waiting calls share, each with its own timeout.

The joins of a large formation all wait for the same change: ``asyncio.wait_for`` on an event
would give each a task of its own besides its future and timer, about as much again as the
rest of the join costs the orchestrator.
"""

from __future__ import annotations

import asyncio


class Wake:
    """Wakes every call waiting on it at once; a call that waits after a wake waits for the
    next one."""

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future] = []
        # Waits that ended without a wake (timed out, cancelled) whose futures are still listed.
        self._stale = 0

    def wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        self._stale = 0
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(True)

    async def wait(self, timeout: float) -> bool:
        """Returns at the next wake (True) or after ``timeout`` seconds (False); the caller
        re-checks its condition either way."""
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._waiters.append(waiter)
        timer = loop.call_later(timeout, _time_out, waiter)
        try:
            return await waiter
        finally:
            timer.cancel()
            if not waiter.done():  # the waiting coroutine was closed, not woken or cancelled
                waiter.cancel()
            if waiter.cancelled() or not waiter.result():
                self._forget_stale()

    def _forget_stale(self) -> None:
        """Drops the futures of waits that ended without a wake once they are half the list: a
        run that never wakes its joins keeps no more than twice its waiting calls."""
        self._stale += 1
        if self._stale * 2 > len(self._waiters):
            self._waiters = [waiter for waiter in self._waiters if not waiter.done()]
            self._stale = 0


def _time_out(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(False)
