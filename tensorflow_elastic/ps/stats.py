"""The master's counters: why gradients were refused or dropped, what was applied, how stale.

They are what ``Master.stats()`` reports and what a checkpoint keeps of the
master, so they live apart from the loop that updates them.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import math
from typing import Any, Sequence

from tensorflow_elastic.ps.gradient import Gradient


class Rejected(str, enum.Enum):
    """Why a gradient was not accepted (the values are the keys of ``stats()["rejected"]``)."""

    STALE = "stale"                     # older than max_staleness versions (synch: any older version)
    FINISHED = "finished"               # its worker acknowledged the end, or the job is stopping
    UNKNOWN_WORKER = "unknown_worker"   # never registered, or removed after dying
    FUTURE_VERSION = "future_version"   # a version the master has not reached (e.g. after a restart)
    DUPLICATE = "duplicate"             # synch: a second gradient from one worker in a round


# Accepted gradients that are dropped instead of applied (keys of ``stats()["dropped"]``).
DROPPED_STALE = "stale"              # aged past max_staleness while held
DROPPED_WORKER_LEFT = "worker_left"  # its worker died or left before the gradient was applied


def percentile(histogram: dict[int, int], fraction: float) -> int | None:
    """Nearest-rank percentile of a {value: count} histogram; None when it is empty."""
    total = sum(histogram.values())
    if total == 0:
        return None
    rank = max(1, math.ceil(fraction * total))
    values = sorted(histogram)
    cumulative = itertools.accumulate(histogram[value] for value in values)
    return next(value for value, seen in zip(values, cumulative) if seen >= rank)


@dataclasses.dataclass
class Tally:
    """The master's counters: what stats() reports and state_dict() saves."""

    accepted: int = 0
    updates: int = 0
    applied: int = 0
    fast_path: int = 0
    peak_workers: int = 0
    rejected: dict[str, int] = dataclasses.field(
        default_factory=lambda: {reason.value: 0 for reason in Rejected})
    dropped: dict[str, int] = dataclasses.field(
        default_factory=lambda: {DROPPED_STALE: 0, DROPPED_WORKER_LEFT: 0})
    per_worker: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    # staleness (versions behind when applied) -> gradients
    staleness: dict[int, int] = dataclasses.field(default_factory=dict)
    losses: list[float] = dataclasses.field(default_factory=list)
    last_loss: float | None = None

    def worker(self, name: str) -> dict[str, int]:
        return self.per_worker.setdefault(name, {"accepted": 0, "rejected": 0, "samples": 0})

    def accept(self, gradient: Gradient, window: int | None) -> None:
        self.accepted += 1
        counts = self.worker(gradient.worker)
        counts["accepted"] += 1
        counts["samples"] += gradient.samples
        if gradient.loss is not None:
            self.last_loss = float(gradient.loss)
            if window is not None:
                self.losses = (self.losses + [self.last_loss])[-2 * window:]

    def reject(self, worker: str, reason: Rejected) -> None:
        self.rejected[reason.value] += 1
        self.worker(worker)["rejected"] += 1

    def update(self, block: Sequence[Gradient], version: int) -> None:
        self.updates += 1
        self.applied += len(block)
        for gradient in block:
            lag = version - gradient.version
            self.staleness[lag] = self.staleness.get(lag, 0) + 1

    def staleness_summary(self) -> dict[str, Any]:
        """The staleness histogram with its median, p95 and max (None while it is empty)."""
        histogram = dict(sorted(self.staleness.items()))
        return {
            "histogram": histogram,
            "median": percentile(histogram, 0.5),
            "p95": percentile(histogram, 0.95),
            "max": max(histogram, default=None),
        }

    def samples(self) -> dict[str, int]:
        return {name: counts["samples"] for name, counts in self.per_worker.items()}

    def state(self) -> dict[str, Any]:
        state = dataclasses.asdict(self)
        state["staleness"] = {str(lag): count for lag, count in self.staleness.items()}
        return state

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "Tally":
        fields = {f.name for f in dataclasses.fields(cls)}
        tally = cls(**{key: value for key, value in state.items() if key in fields})
        tally.staleness = {int(lag): int(count) for lag, count in tally.staleness.items()}
        return tally
