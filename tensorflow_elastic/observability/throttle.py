"""A log that a flood cannot fill: one line per key per interval, with the count since the last.

Refused calls (by peer, by reason) use it, so that a misconfigured node or a
prober shows up in the log without drowning it.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable


class Throttle:
    """Counts events by key and says when a key's next log line is due (thread-safe).

    Only the ``max_keys`` most recent keys are remembered, so hostile callers
    cannot make it grow.
    """

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = 1024):
        self._interval = interval
        self._clock = clock
        self._max_keys = max_keys
        self._lock = threading.Lock()
        # key -> (when its last line was due, events since)
        self._keys: collections.OrderedDict[str, tuple[float | None, int]] = \
            collections.OrderedDict()

    def note(self, key: str) -> int:
        """Counts one event; returns how many to log now (this one included), or 0 to stay quiet."""
        now = self._clock()
        with self._lock:
            logged_at, count = self._keys.pop(key, (None, 0))
            count += 1
            due = logged_at is None or now - logged_at >= self._interval
            self._keys[key] = (now, 0) if due else (logged_at, count)
            while len(self._keys) > self._max_keys:
                self._keys.popitem(last=False)
        return count if due else 0
