"""Prometheus metrics of one agent's workers, from the node files they write.

The workers' records carry running counts (recoveries, lost steps, sync
bytes); a restarted worker starts again from zero, so each slot's counts are
taken relative to the last record of the same node.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import prometheus_client as prom

from tensorflow_elastic.membership.node_file import NodeRecord

# Steps per second are measured over at least this long.
RATE_WINDOW_S = 10.0
_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)


class WorkerMetrics:
    """The job's step, steps/s, generation and world size as this agent's workers see them,
    and per worker (local rank) recoveries, their durations, lost steps and sync bytes."""

    def __init__(self, run_id: str, clock: Callable[[], float] = time.monotonic):
        self.registry = prom.CollectorRegistry()
        self._run_id = run_id
        self._clock = clock
        job, worker = ["run_id"], ["run_id", "local_rank"]
        self.step = prom.Gauge("tfelastic_worker_step", "The job's global step (commits) as "
                               "this agent's workers last reported it.", job,
                               registry=self.registry)
        self.steps_per_second = prom.Gauge("tfelastic_worker_steps_per_second",
                                           f"Global steps per second over the last "
                                           f"{RATE_WINDOW_S:g} s or more.", job,
                                           registry=self.registry)
        self.generation = prom.Gauge("tfelastic_worker_generation",
                                     "The newest generation this agent's workers are in.", job,
                                     registry=self.registry)
        self.world_size = prom.Gauge("tfelastic_worker_world_size",
                                     "Members of that generation.", job, registry=self.registry)
        self.recoveries = prom.Counter("tfelastic_worker_recoveries",
                                       "Failures a worker recovered from.", worker,
                                       registry=self.registry)
        self.recovery_duration = prom.Histogram(
            "tfelastic_worker_recovery_duration_seconds",
            "From a failed step to the end of the state sync in the next generation.", worker,
            registry=self.registry, buckets=_DURATION_BUCKETS)
        self.lost_steps = prom.Counter("tfelastic_worker_lost_steps",
                                       "Steps redone after recoveries.", worker,
                                       registry=self.registry)
        self.sync_bytes = prom.Counter("tfelastic_worker_sync_bytes",
                                       "State bytes a worker sent or received in syncs.", worker,
                                       registry=self.registry)
        self._seen: dict[int, NodeRecord] = {}  # slot -> the last record counted
        self._rate_from: tuple[float, int] | None = None

    def update(self, records: Sequence[NodeRecord | None]) -> None:
        """Takes in the slots' newest records (None: that slot's worker wrote none yet)."""
        present = [r for r in records if r is not None]
        if present:
            newest = max(present, key=lambda r: (r.generation, r.step))
            self.generation.labels(self._run_id).set(newest.generation)
            self.world_size.labels(self._run_id).set(newest.world_size)
            self._count_step(max(r.step for r in present))
        for slot, record in enumerate(records):
            if record is not None:
                self._count_worker(slot, record)

    def _count_step(self, step: int) -> None:
        self.step.labels(self._run_id).set(step)
        now = self._clock()
        if self._rate_from is None or step < self._rate_from[1]:
            self._rate_from = (now, step)
        elif now - self._rate_from[0] >= RATE_WINDOW_S:
            self.steps_per_second.labels(self._run_id).set(
                (step - self._rate_from[1]) / (now - self._rate_from[0]))
            self._rate_from = (now, step)

    def _count_worker(self, slot: int, record: NodeRecord) -> None:
        last = self._seen.get(slot)
        if last is None or last.node_id != record.node_id:
            last = NodeRecord(record.node_id, 0, 0)  # a new worker counts from zero
        labels = (self._run_id, str(slot))
        new_recoveries = record.recoveries - last.recoveries
        if new_recoveries > 0:
            self.recoveries.labels(*labels).inc(new_recoveries)
            for seconds in record.recovery_seconds[-new_recoveries:]:
                self.recovery_duration.labels(*labels).observe(seconds)
        for counter, now, before in ((self.lost_steps, record.lost_steps, last.lost_steps),
                                     (self.sync_bytes, record.sync_bytes, last.sync_bytes)):
            if now > before:
                counter.labels(*labels).inc(now - before)
        self._seen[slot] = record
