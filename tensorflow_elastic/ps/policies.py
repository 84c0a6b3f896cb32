"""Gradient-ordering policies: which held gradients the master applies next, and how they are weighted.

A policy is the master's priority structure. It decides four things, each a
method so the master loop stays the same for every policy:

* the order (``priority``: smaller first, ties broken by arrival);
* when a block is ready and how big it is (``block_size``);
* the staleness bound and any extra admission rule (``staleness_bound``, ``admits``);
* the weight of each gradient in the block's mean (``weights``).

Orderings that depend on the last update (cdismin/cdismax) are recomputed in
``observe_update``; the others are fixed when a gradient is pushed, so a heap
serves them all.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Callable, Collection, Iterator, Mapping, Sequence

import numpy as np

from tensorflow_elastic.ps.config import PSConfig
from tensorflow_elastic.ps.gradient import Gradient


class Policy:
    """FIFO order, blocks of ``synch_block_size`` once ``min_to_accept`` are held, plain mean.

    The other policies change only what differs from this.
    """

    # Apply each accepted gradient before accepting the next (granular).
    eager = False

    def __init__(self, name: str):
        self.name = name
        self._heap: list[tuple[tuple[float, ...], int, int, Gradient]] = []
        # Breaks ties between equal sequences, so gradients themselves are never compared.
        self._pushes = itertools.count()

    # ------------------------------------------------------------ policy rules

    def priority(self, gradient: Gradient) -> tuple[float, ...]:
        """Sort key: smaller is applied sooner; arrival order breaks ties."""
        return ()

    def staleness_bound(self, config: PSConfig) -> int | None:
        """Most versions a gradient may lag behind and still be applied."""
        return config.max_staleness

    def admits(self, gradient: Gradient) -> bool:
        """An admission rule of the policy's own, after the master's checks passed."""
        return True

    def capacity(self, config: PSConfig) -> int | None:
        """Most gradients held at once (``asynch_max``); None when unbounded."""
        return config.asynch_max

    def block_size(self, config: PSConfig, live_workers: Collection[str], flush: bool) -> int:
        """Gradients in the next update, or 0 when no update is due.

        ``flush`` (the job is stopping) lets a last, smaller block go out so no
        accepted gradient is left unapplied.
        """
        held = len(self._heap)
        if held >= config.min_held():
            return config.synch_block_size
        return min(held, config.synch_block_size) if flush else 0

    def weights(self, block: Sequence[Gradient], samples_seen: Mapping[str, int]) -> np.ndarray | None:
        """Weights of the block's gradients in the update (summing to 1); None for the plain mean."""
        return None

    def observe_update(self, aggregate: Sequence[np.ndarray]) -> None:
        """Told every applied update, for orderings that depend on it."""

    # --------------------------------------------------------- the held gradients

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Gradient]:
        return (entry[-1] for entry in self._heap)

    def push(self, gradient: Gradient) -> None:
        heapq.heappush(self._heap, self._entry(gradient))

    def pop(self, count: int) -> list[Gradient]:
        """The ``count`` highest-priority gradients, best first."""
        return [heapq.heappop(self._heap)[-1] for _ in range(min(count, len(self._heap)))]

    def remove_if(self, predicate: Callable[[Gradient], bool]) -> list[Gradient]:
        """Takes out the held gradients ``predicate`` selects (a departed worker's, expired ones)."""
        removed = [entry[-1] for entry in self._heap if predicate(entry[-1])]
        if removed:
            self._heap = [entry for entry in self._heap if not predicate(entry[-1])]
            heapq.heapify(self._heap)
        return removed

    def drain(self) -> list[Gradient]:
        """Everything held, in arrival order (to move it into another policy)."""
        held = sorted(self, key=lambda g: g.sequence)
        self._heap = []
        return held

    def _entry(self, gradient: Gradient) -> tuple[tuple[float, ...], int, int, Gradient]:
        return (self.priority(gradient), gradient.sequence, next(self._pushes), gradient)

    def _reprioritise(self) -> None:
        self._heap = [self._entry(entry[-1]) for entry in self._heap]
        heapq.heapify(self._heap)


class Synchronous(Policy):
    """One gradient from every live worker, all computed on the current version, averaged together.

    A gradient for an older version is stale (the bound is 0), a second one
    from the same worker in a round is refused, and a worker that leaves is no
    longer waited for. The block settings do not apply.
    """

    def staleness_bound(self, config: PSConfig) -> int | None:
        return 0

    def admits(self, gradient: Gradient) -> bool:
        return all(held.worker != gradient.worker for held in self)

    def capacity(self, config: PSConfig) -> int | None:
        return None

    def block_size(self, config: PSConfig, live_workers: Collection[str], flush: bool) -> int:
        held_workers = {g.worker for g in self}
        return len(self._heap) if self._heap and held_workers.issuperset(live_workers) else 0


class LeastStale(Policy):
    """asynch / asypq: the freshest gradient first (highest version = least stale)."""

    def priority(self, gradient: Gradient) -> tuple[float, ...]:
        return (-gradient.version,)


class MostStale(Policy):
    """stale: the oldest gradient first, so none waits long."""

    def priority(self, gradient: Gradient) -> tuple[float, ...]:
        return (gradient.version,)


class CosineDistance(Policy):
    """cdismin / cdismax: order by cosine distance to the last applied update.

    The reference is the most recently applied aggregated gradient (the mean
    the optimizer received, not the parameter change, which points the other
    way for SGD). Distance is ``1 - cos`` in [0, 2]: cdismin prefers gradients
    that agree with the last update, cdismax the ones that disagree most.
    Before the first update, or when the reference is all zeros, every
    distance counts as 0 and arrival order decides; a zero gradient has
    distance 1 (orthogonal).
    """

    # +1: smallest distance first (cdismin); -1: largest first (cdismax).
    direction = 1.0

    def __init__(self, name: str):
        super().__init__(name)
        self._reference: Sequence[np.ndarray] | None = None
        self._reference_norm = 0.0

    def distance(self, gradient: Gradient) -> float:
        if self._reference is None:
            return 0.0
        norm = _norm(gradient.arrays)
        if norm == 0.0:
            return 1.0
        dot = sum(float(np.vdot(g, r)) for g, r in zip(gradient.arrays, self._reference))
        return 1.0 - dot / (norm * self._reference_norm)

    def priority(self, gradient: Gradient) -> tuple[float, ...]:
        return (self.direction * self.distance(gradient),)

    def observe_update(self, aggregate: Sequence[np.ndarray]) -> None:
        norm = _norm(aggregate)
        self._reference = aggregate if norm > 0.0 else None
        self._reference_norm = norm
        self._reprioritise()


class CosineDistanceMax(CosineDistance):
    direction = -1.0


class Granular(Policy):
    """One gradient per update in arrival order, applied as soon as it is accepted.

    ``eager`` makes the master apply before accepting the next gradient, so
    each acceptance sees the newest version; with nothing else held the
    master skips the heap altogether (the fast path). ``synch_block_size``
    and ``min_to_accept`` do not apply.
    """

    eager = True

    def block_size(self, config: PSConfig, live_workers: Collection[str], flush: bool) -> int:
        return 1 if self._heap else 0


class DataSkew(Policy):
    """wskew: arrival order; each gradient weighted by the inverse of its worker's share of samples.

    ``share_i = s_i / S`` where ``s_i`` is the samples behind worker i's
    accepted gradients so far and ``S`` the total over all workers; the weight
    is ``w_i = (1 / share_i) / sum_j (1 / share_j)`` over the block, which is
    ``(1 / s_i) / sum_j (1 / s_j)``. A worker that has contributed more data
    (a fast one, or one with a larger shard) counts for less, so the model is
    not pulled towards its data. With ``synch_block_size`` 1 the weight is 1.
    """

    def weights(self, block: Sequence[Gradient], samples_seen: Mapping[str, int]) -> np.ndarray | None:
        inverse = np.array([1.0 / max(samples_seen.get(g.worker, 0), 1) for g in block])
        return inverse / inverse.sum()


_POLICIES: dict[str, type[Policy]] = {
    "synch": Synchronous,
    "fifo": Policy,
    "asynch": LeastStale,
    "asypq": LeastStale,
    "stale": MostStale,
    "cdismin": CosineDistance,
    "cdismax": CosineDistanceMax,
    "granular": Granular,
    "wskew": DataSkew,
}


def make_policy(name: str) -> Policy:
    """The policy called ``name`` (one of :data:`tensorflow_elastic.ps.config.POLICIES`)."""
    try:
        return _POLICIES[name](name)
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of: {', '.join(_POLICIES)}") from None


def _norm(arrays: Sequence[np.ndarray]) -> float:
    return float(np.sqrt(sum(float(np.vdot(a, a)) for a in arrays)))
