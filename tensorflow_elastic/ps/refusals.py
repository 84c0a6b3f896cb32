"""Counts of refused calls by reason, and a log of them that a flood cannot fill.

Every refusal counts (``stats()["bad_requests"]``); the log gets at most one
line per reason per :data:`LOG_INTERVAL_S`, saying how many were refused since
its last line, so a misconfigured or hostile caller is visible without
drowning the PS's output.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable

from tensorflow_elastic.observability.throttle import Throttle

logger = logging.getLogger(__name__)

LOG_INTERVAL_S = 10.0


class Refusals:
    """Thread-safe counts of refused calls by reason, logged at a bounded rate."""

    def __init__(self, log_interval: float = LOG_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic):
        self._throttle = Throttle(log_interval, clock)
        self._lock = threading.Lock()
        self._counts: collections.Counter[str] = collections.Counter()

    def record(self, reason: str, message: str) -> None:
        """Counts one refusal; logs it unless ``reason`` was logged within the interval."""
        with self._lock:
            self._counts[reason] += 1
        count = self._throttle.note(reason)
        if count:
            logger.warning("refused %d call(s) (%s) since the last report: %s", count, reason,
                           message)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)
