"""The parameter server's settings: which policy orders gradients, and how many make an update.

The names follow the predecessor system: ``synch_block_size`` is
``num_toApply`` (gradients averaged into one update), ``min_to_accept`` and
``max_to_accept`` are ``min_toAccept`` / ``max_toAccept``. ``None`` means "the
default described on the field"; :meth:`PSConfig.min_held`,
:meth:`PSConfig.take_limit` and :meth:`PSConfig.held_capacity` resolve those
defaults in one place so the master and the docs cannot disagree.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

SYNCH = "synch"
POLICIES = (SYNCH, "fifo", "asynch", "asypq", "stale", "cdismin", "cdismax", "granular", "wskew")

# Settings that must be whole numbers, and the least value each may take.
_MINIMUMS = {
    "synch_block_size": 1,
    "asynch_max": 1,
    "max_to_accept": 1,
    "min_to_accept": 1,
    "max_staleness": 0,
    "iterations": 1,
    "workers": 1,
    "convergence_window": 1,
    "max_queued": 1,
}
# Settings among those that have no "None" default.
_REQUIRED = ("synch_block_size", "max_queued")


@dataclasses.dataclass
class PSConfig:
    """How the master accepts, orders and aggregates gradients (see docs/ps.md).

    Rules enforced by :meth:`validate`: ``synch_block_size <= min_to_accept <=
    max_to_accept`` and ``min_to_accept <= asynch_max``, so a block can always
    be formed. The ``synch`` policy ignores the block settings: its update is
    one gradient from every live worker.
    """

    policy: str = "asypq"
    # num_toApply: gradients averaged into one update.
    synch_block_size: int = 1
    # Most accepted gradients held at once; taking from the queue stops at this
    # bound. None: no bound of its own (held stays below min_to_accept + max_to_accept).
    asynch_max: int | None = None
    # Gradients taken from the queue per iteration; None: the number of live workers (at least 1).
    max_to_accept: int | None = None
    # Held gradients needed before an update is aggregated; None: synch_block_size.
    min_to_accept: int | None = None
    # Gradients older than this many versions are rejected (and dropped if they age past it
    # while held); None: no bound.
    max_staleness: int | None = None
    # Async policies: the PS stops after workers x iterations accepted gradients.
    # synch: each worker counts its own iterations; the master only tracks.
    iterations: int | None = None
    # Async: workers in the total; None: the most workers that have been live at once.
    # synch: the first update waits until this many workers have registered; None: no wait.
    workers: int | None = None
    # Stop when the mean loss of the last window improves on the window before
    # by less than convergence_tolerance (relative); None: no convergence check.
    convergence_window: int | None = None
    convergence_tolerance: float = 1e-3
    # Gradients waiting for the master loop; a push beyond is refused (RESOURCE_EXHAUSTED,
    # queue_full) and the worker retries after a pause. Each holds a model-sized buffer.
    max_queued: int = 256

    @property
    def is_synchronous(self) -> bool:
        return self.policy == SYNCH

    def min_held(self) -> int:
        """Held gradients needed before the next update (``min_toAccept``)."""
        return self.min_to_accept if self.min_to_accept is not None else self.synch_block_size

    def take_limit(self, live_workers: int) -> int:
        """Gradients to take from the queue per iteration (``max_toAccept``).

        The default follows the live workers so a backed-up queue is drained
        over several iterations instead of being averaged into a few huge updates.
        """
        return self.max_to_accept if self.max_to_accept is not None else max(1, live_workers)

    def held_capacity(self) -> int | None:
        """Most gradients held at once (``asynch_max``); None when unbounded."""
        return self.asynch_max

    def validate(self) -> None:
        """Raises ValueError naming the setting to change."""
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; choose one of: {', '.join(POLICIES)}")
        for name, least in _MINIMUMS.items():
            value = getattr(self, name)
            if value is None and name not in _REQUIRED:
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be a whole number, got {value!r}")
            if value < least:
                raise ValueError(f"{name} must be at least {least}, got {value}")
        tolerance = self.convergence_tolerance
        if (isinstance(tolerance, bool) or not isinstance(tolerance, (int, float))
                or not math.isfinite(tolerance) or tolerance < 0):
            raise ValueError(f"convergence_tolerance must be a finite number >= 0, "
                             f"got {tolerance!r}")
        if self.min_held() < self.synch_block_size:
            raise ValueError(
                f"min_to_accept ({self.min_to_accept}) is below synch_block_size "
                f"({self.synch_block_size}): an update needs synch_block_size held gradients; "
                "raise min_to_accept or lower synch_block_size")
        if self.max_to_accept is not None and self.max_to_accept < self.min_held():
            raise ValueError(
                f"max_to_accept ({self.max_to_accept}) is below min_to_accept ({self.min_held()}); "
                "raise max_to_accept or lower min_to_accept / synch_block_size")
        if self.asynch_max is not None and self.asynch_max < self.min_held():
            raise ValueError(
                f"asynch_max ({self.asynch_max}) is below min_to_accept ({self.min_held()}): "
                "the master could never hold enough gradients for an update; raise asynch_max "
                "or lower min_to_accept / synch_block_size")

    def replace(self, **changes: Any) -> "PSConfig":
        """A validated copy with ``changes``; the way settings change while training runs."""
        fields = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - fields)
        if unknown:
            raise ValueError(f"unknown PS setting(s) {', '.join(unknown)}; "
                             f"settings: {', '.join(sorted(fields))}")
        changed = dataclasses.replace(self, **changes)
        changed.validate()
        return changed
