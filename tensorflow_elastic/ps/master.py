"""The master loop of the parameter server: accept or reject gradients, order them, aggregate, apply.

gRPC handler threads only :meth:`Master.submit` (an append under a lock), so
a slow update never holds up a worker's request; a push then waits
(:meth:`Master.wait_dealt_with`) until the loop has applied, held or
rejected its gradient, so each worker has at most one gradient waiting and
staleness follows the other workers' progress, not the PS's backlog. One thread runs
:meth:`Master.run_once` in a loop: it takes up to ``max_to_accept`` queued
gradients, checks each (unknown or finished worker, version from the future,
staleness bound), holds the accepted ones in the policy's priority structure
and, while the policy says a block is due, averages the block and calls
``apply`` outside the lock. Counts, the last update (the cdis reference) and
the per-worker samples (the wskew shares) survive a restart through
:meth:`Master.state_dict`. No TensorFlow here: gradients are numpy arrays.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from tensorflow_elastic.ps.config import PSConfig
from tensorflow_elastic.ps import divergence
from tensorflow_elastic.ps.gradient import Gradient, aggregate
from tensorflow_elastic.ps.policies import Policy, make_policy
from tensorflow_elastic.ps.stats import DROPPED_STALE, DROPPED_WORKER_LEFT, Rejected, Tally

# Names passed to ``on_event``.
WORKER_ADDED = "ps_worker_added"
WORKER_REMOVED = "ps_worker_removed"
CONFIG_CHANGED = "ps_config_changed"
STOPPED = "ps_stop"

# Values of ``stop_reason``.
STOP_ITERATIONS = "iterations"
STOP_CONVERGED = "converged"
STOP_DIVERGED = "diverged"

# Keys of ``state_dict()`` that hold arrays (a list of arrays, or None); all others are JSON.
ARRAY_KEYS = ("reference",)


def plateaued(losses: Sequence[float], window: int, tolerance: float) -> bool:
    """True when the mean of the last ``window`` losses improves on the window before by less
    than ``tolerance``, relative to the earlier mean."""
    if len(losses) < 2 * window:
        return False
    before = float(np.mean(losses[-2 * window:-window]))
    last = float(np.mean(losses[-window:]))
    return (before - last) < tolerance * max(abs(before), np.finfo(float).tiny)


class QueueFull(Exception):
    """The gradient queue holds ``max_queued`` gradients; the pusher should retry later."""


class Master:
    """Accepts, orders, aggregates and applies gradients as ``config.policy`` says.

    ``apply(arrays, new_version)`` is called from the thread running
    :meth:`run_once` (one thread at a time runs the loop); the version is
    bumped after it returns. An exception from ``apply`` propagates and its
    block is lost. ``on_event(name, **fields)`` hears of workers joining and
    leaving, configuration changes and the stop decision; it is called
    without the master's lock held, so it may call back into the master.
    """

    def __init__(self, config: PSConfig, apply: Callable[[list[np.ndarray], int], None],
                 version: int = 0, on_event: Callable[..., None] | None = None):
        config.validate()
        self._config = config
        self._apply = apply
        self._on_event = on_event
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._loop_lock = threading.Lock()
        self._woken = False
        self._queue: collections.deque[Gradient] = collections.deque()
        self._version = version
        self._sequence = 0
        self._live: set[str] = set()
        # finished worker -> first sequence number submitted after it finished
        self._finished: dict[str, int] = {}
        self._policy: Policy = make_policy(config.policy)
        self._reference: list[np.ndarray] | None = None
        self._tally = Tally()
        self._stop_reason: str | None = None
        self._stop_message = ""
        # Sequence numbers of submitted gradients the loop has not dealt with yet.
        self._pending: set[int] = set()
        self._dealt = threading.Condition(self._lock)
        self._closed = False
        self._outbox: list[tuple[str, dict[str, Any]]] = []

    # ------------------------------------------------------------------ properties

    @property
    def version(self) -> int:
        with self._lock:
            return self._version

    @property
    def config(self) -> PSConfig:
        """The newest configuration (the loop adopts it at its next iteration)."""
        with self._lock:
            return self._config

    @property
    def stop_reason(self) -> str | None:
        with self._lock:
            return self._stop_reason

    @property
    def peak_workers(self) -> int:
        """The most workers live at once so far."""
        with self._lock:
            return self._tally.peak_workers

    @property
    def stop_message(self) -> str:
        """Why the job stopped, in words (a divergence's report); empty otherwise."""
        with self._lock:
            return self._stop_message

    # --------------------------------------------------------------- membership

    def add_worker(self, worker: str) -> None:
        """Registers a worker (again, after it finished or died: it starts afresh)."""
        with self._lock:
            if worker not in self._live:
                self._live.add(worker)
                self._finished.pop(worker, None)
                self._tally.peak_workers = max(self._tally.peak_workers, len(self._live))
                self._emit_later(WORKER_ADDED, worker=worker, live=len(self._live))
        self._deliver()

    def remove_worker(self, worker: str, finished: bool = False) -> None:
        """A worker is gone: ``finished`` after it acknowledged the end, else it died or left.

        A finished worker's gradients submitted before it finished still
        count; later ones are rejected as FINISHED. A dead worker's queued and
        held gradients are dropped (it loses only what was in flight). Either
        way ``synch`` stops waiting for it.
        """
        with self._wake:
            if worker not in self._live:
                return
            self._live.discard(worker)
            dropped = 0
            if finished:
                self._finished[worker] = self._sequence
            else:
                kept = collections.deque(g for g in self._queue if g.worker != worker)
                dropped = len(self._queue) - len(kept)
                self._settle(g for g in self._queue if g.worker == worker)
                self._queue = kept
                dropped += len(self._policy.remove_if(lambda g: g.worker == worker))
                self._tally.dropped[DROPPED_WORKER_LEFT] += dropped
            self._woken = True
            self._wake.notify_all()
            self._emit_later(WORKER_REMOVED, worker=worker, finished=finished, dropped=dropped,
                             live=len(self._live))
        self._deliver()

    def live_workers(self) -> list[str]:
        with self._lock:
            return sorted(self._live)

    # ------------------------------------------------------------ configuration

    def update_config(self, **changes: Any) -> None:
        """Changes settings while training runs; the loop adopts them at its next iteration.

        Raises ValueError (and keeps the old settings) when the result is invalid.
        """
        with self._wake:
            self._config = self._config.replace(**changes)
            self._woken = True
            self._wake.notify_all()
            self._emit_later(CONFIG_CHANGED, changes=dict(changes))
        self._deliver()

    # ------------------------------------------------------------------- the loop

    def submit(self, gradient: Gradient) -> None:
        """Queues a gradient and stamps its arrival order; never waits for an update.

        Raises QueueFull when ``max_queued`` gradients are waiting already.
        """
        with self._wake:
            if len(self._queue) >= self._config.max_queued:
                raise QueueFull(f"{len(self._queue)} gradients are waiting for the parameter "
                                f"server (max_queued); retry after a pause, or raise max_queued")
            gradient.sequence = self._sequence
            self._sequence += 1
            self._queue.append(gradient)
            self._pending.add(gradient.sequence)
            self._wake.notify()

    def wait_dealt_with(self, gradient: Gradient, timeout: float) -> bool:
        """Waits until the loop has applied, held or rejected a submitted gradient (or it was
        dropped, or the master closed); False after ``timeout``.

        A push that waits for this keeps its worker from computing on parameters that its
        own queued gradients will change: staleness stays bounded by the other workers.
        """
        with self._dealt:
            return self._dealt.wait_for(
                lambda: gradient.sequence not in self._pending or self._closed, timeout)

    def close(self) -> None:
        """The loop has ended: no gradient will be dealt with any more; nobody waits for one."""
        with self._dealt:
            self._closed = True
            self._dealt.notify_all()

    def diverge(self, worker: str, what: str) -> None:
        """A worker's loss or gradient became NaN or Inf (``what``, from
        :func:`divergence.what_diverged`): the job stops, saying why.

        The value itself was refused (it would poison the parameters); going on would
        only diverge again, so every worker is told to stop.
        """
        with self._lock:
            if self._stop_reason is None:
                self._stop_reason = STOP_DIVERGED
                self._stop_message = divergence.report(
                    f"{what} on worker {worker} at version {self._version}", self._config.policy)
                self._emit_later(STOPPED, reason=STOP_DIVERGED, accepted=self._tally.accepted,
                                 version=self._version, message=self._stop_message,
                                 last_loss=self._tally.last_loss)
        self._deliver()

    def run_once(self, timeout: float) -> int:
        """One iteration: wait up to ``timeout`` for gradients, take, check, hold, apply.

        Returns the number of updates applied. Membership and configuration
        changes wake it too, since they can make a block due (e.g. ``synch``
        after a worker left).
        """
        with self._loop_lock:
            with self._wake:
                self._wake.wait_for(lambda: self._queue or self._woken, timeout)
                self._woken = False
                config = self._adopt_config()
                self._evaluate_stop(config)
                taken = self._take(config)
            try:
                updates = self._deal_with(taken, config)
            finally:
                with self._lock:
                    self._settle(taken)
        self._deliver()
        return updates

    def _deal_with(self, taken: list[Gradient], config: PSConfig) -> int:
        """Accepts or rejects each taken gradient, then applies the blocks due; the updates."""
        updates = 0
        for gradient in taken:
            with self._lock:
                apply_now = self._accept(gradient, config)
                version = self._version
            if apply_now:
                self._apply_block([gradient], None, version)
                updates += 1
            elif self._policy.eager:
                updates += self._apply_ready(config)
        return updates + self._apply_ready(config)

    def should_stop(self) -> bool:
        """True once the async iteration total is reached or the loss has plateaued."""
        with self._lock:
            self._evaluate_stop(self._config)
            stopped = self._stop_reason is not None
        self._deliver()
        return stopped

    # --------------------------------------------------------------- reporting

    def stats(self) -> dict[str, Any]:
        """Counts for status pages and benchmarks.

        ``staleness`` has the histogram (versions behind when applied ->
        gradients) and its median, p95 and max; ``per_worker`` has each
        worker's accepted, rejected and samples.
        """
        with self._lock:
            tally = self._tally
            return {
                "policy": self._policy.name,
                "version": self._version,
                "accepted": tally.accepted,
                "rejected": dict(tally.rejected),
                "rejected_total": sum(tally.rejected.values()),
                "dropped": dict(tally.dropped),
                "updates": tally.updates,
                "applied": tally.applied,
                "fast_path": tally.fast_path,
                "held": len(self._policy),
                "queued": len(self._queue),
                "live_workers": sorted(self._live),
                "peak_workers": tally.peak_workers,
                "per_worker": {name: dict(counts) for name, counts in tally.per_worker.items()},
                "staleness": tally.staleness_summary(),
                "last_loss": tally.last_loss,
                "stop_reason": self._stop_reason,
                "stop_message": self._stop_message,
            }

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: counts, version, and the last update under ``"reference"``.

        Every key but those in :data:`ARRAY_KEYS` is JSON-serialisable;
        ``"reference"`` is a list of arrays (None before the first update).
        Queued and held gradients are not kept: workers resend after a restart.
        """
        with self._lock:
            state = self._tally.state()
            state["version"] = self._version
            state["sequence"] = self._sequence
            state["reference"] = None if self._reference is None else list(self._reference)
            return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resumes from :meth:`state_dict`; queued and held gradients are discarded."""
        with self._lock:
            self._tally = Tally.from_state(state)
            self._version = int(state["version"])
            self._sequence = int(state["sequence"])
            reference = state.get("reference")
            self._reference = None if reference is None else [np.asarray(a) for a in reference]
            self._settle(self._queue)
            self._queue.clear()
            self._policy = self._new_policy(self._config.policy)
            self._stop_reason = None
            self._stop_message = ""

    # ------------------------------------------------------------------ internals

    def _adopt_config(self) -> PSConfig:
        """The configuration for this iteration; moves held gradients into a new policy's order."""
        config = self._config
        if config.policy != self._policy.name:
            held = self._policy.drain()
            self._policy = self._new_policy(config.policy)
            for gradient in held:
                self._policy.push(gradient)
        return config

    def _settle(self, gradients: Iterable[Gradient]) -> None:
        """Under the lock: these gradients are dealt with; their pushes may return."""
        self._pending.difference_update(g.sequence for g in gradients)
        self._dealt.notify_all()

    def _new_policy(self, name: str) -> Policy:
        policy = make_policy(name)
        if self._reference is not None:
            policy.observe_update(self._reference)
        return policy

    def _take(self, config: PSConfig) -> list[Gradient]:
        """Up to ``max_to_accept`` queued gradients, fewer when the held structure is near full."""
        limit = config.take_limit(len(self._live))
        capacity = self._policy.capacity(config)
        if capacity is not None:
            limit = min(limit, max(0, capacity - len(self._policy)))
        return [self._queue.popleft() for _ in range(min(limit, len(self._queue)))]

    def _check(self, gradient: Gradient, config: PSConfig) -> Rejected | None:
        if self._stop_reason is not None:
            return Rejected.FINISHED
        finished_at = self._finished.get(gradient.worker)
        if finished_at is not None:
            if gradient.sequence >= finished_at:
                return Rejected.FINISHED
        elif gradient.worker not in self._live:
            return Rejected.UNKNOWN_WORKER
        if gradient.version > self._version:
            return Rejected.FUTURE_VERSION
        bound = self._policy.staleness_bound(config)
        if bound is not None and self._version - gradient.version > bound:
            return Rejected.STALE
        if not self._policy.admits(gradient):
            return Rejected.DUPLICATE
        return None

    def _accept(self, gradient: Gradient, config: PSConfig) -> bool:
        """Checks and holds one gradient (under the lock); True to apply it at once (fast path)."""
        reason = self._check(gradient, config)
        if reason is not None:
            self._tally.reject(gradient.worker, reason)
            return False
        self._tally.accept(gradient, config.convergence_window)
        self._evaluate_stop(config)
        if self._policy.eager and not len(self._policy):
            self._tally.fast_path += 1
            return True
        self._policy.push(gradient)
        return False

    def _apply_ready(self, config: PSConfig) -> int:
        """Applies blocks while the policy says one is due; after a stop, flushes what is held."""
        updates = 0
        while True:
            with self._lock:
                bound = self._policy.staleness_bound(config)
                if bound is not None:
                    expired = self._policy.remove_if(lambda g: self._version - g.version > bound)
                    self._tally.dropped[DROPPED_STALE] += len(expired)
                count = (self._policy.block_size(config, self._live, self._stop_reason is not None)
                         if self._started(config) else 0)
                if not count:
                    return updates
                block = self._policy.pop(count)
                weights = self._policy.weights(block, self._tally.samples())
                version = self._version
            self._apply_block(block, weights, version)
            updates += 1

    def _apply_block(self, block: list[Gradient], weights: np.ndarray | None, version: int) -> None:
        arrays = aggregate(block, weights)
        self._apply(arrays, version + 1)
        with self._lock:
            self._version = version + 1
            self._tally.update(block, version)
            self._reference = arrays
            self._policy.observe_update(arrays)

    def _started(self, config: PSConfig) -> bool:
        """synch with ``workers`` set holds its first update until that many have registered,
        so the first rounds are not averaged over whoever connected first."""
        return (not config.is_synchronous or config.workers is None
                or self._tally.peak_workers >= config.workers)

    def _iteration_target(self, config: PSConfig) -> int | None:
        """Accepted gradients that end an async job: workers x iterations."""
        if config.is_synchronous or config.iterations is None:
            return None
        workers = config.workers if config.workers is not None else self._tally.peak_workers
        return workers * config.iterations if workers else None

    def _evaluate_stop(self, config: PSConfig) -> None:
        if self._stop_reason is not None:
            return
        target = self._iteration_target(config)
        if target is not None and self._tally.accepted >= target:
            self._stop_reason = STOP_ITERATIONS
        elif config.convergence_window is not None and plateaued(
                self._tally.losses, config.convergence_window, config.convergence_tolerance):
            self._stop_reason = STOP_CONVERGED
        else:
            return
        self._emit_later(STOPPED, reason=self._stop_reason, accepted=self._tally.accepted,
                         version=self._version, target=target, last_loss=self._tally.last_loss)

    def _emit_later(self, name: str, **fields: Any) -> None:
        self._outbox.append((name, fields))

    def _deliver(self) -> None:
        """Calls on_event for what happened, outside the lock."""
        with self._lock:
            outbox, self._outbox = self._outbox, []
        if self._on_event is not None:
            for name, fields in outbox:
                self._on_event(name, **fields)
