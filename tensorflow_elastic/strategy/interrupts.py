"""Aborting the collectives of generations that ended, and only those.

News that peers are gone arrives on background threads (heartbeats, the watch
stream, the watchdog) while the training thread may be moving TensorFlow to
the next generation. An abort meant for an ended generation must not land on
the next one, nor be lost before the move: the two never interleave.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

from tensorflow_elastic.strategy import cluster


class CollectiveInterrupter:
    """Which generation TensorFlow's collectives serve, and which generations have ended."""

    def __init__(self, serving: int = -1):
        self._lock = threading.Lock()
        # The generation TensorFlow's collectives run in (-1 before there is a strategy).
        self._serving = serving
        # Every generation below this one has ended (the orchestrator announced this one).
        self.ended_below = 0

    def has_ended(self, generation: int) -> bool:
        """Whether the orchestrator announced a generation after `generation`."""
        return generation < self.ended_below

    def serve(self, generation: int) -> None:
        """TensorFlow's collectives now run in `generation` (the strategy's first)."""
        with self._lock:
            self._serving = generation

    def peers_lost(self, reason: str, generation: int | None) -> None:
        """Aborts the collectives of the generations that ended before `generation` (None: all)."""
        with self._lock:
            if generation is not None:
                self.ended_below = max(self.ended_below, generation)
                if self._serving >= generation:
                    return  # old news: TensorFlow already serves that generation
            cluster.abort_collectives(reason)

    @contextlib.contextmanager
    def moving_to(self, generation: int) -> Iterator[None]:
        """Around the move of TensorFlow to `generation` (the move clears an earlier abort)."""
        with self._lock:
            yield
            self._serving = generation
            if self.has_ended(generation):
                # It ended while this node moved to it: nothing else would unblock its
                # first collective (the state sync's broadcast).
                cluster.abort_collectives(f"generation {generation} ended while this node "
                                          f"joined it")
