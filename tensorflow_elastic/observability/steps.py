"""`step` events from a training loop, at a rate the user sets.

The step rate in progress lines, plots and summaries comes from these events.
Recording every step of a fast loop would flood the events file, so a
reporter records every ``every``-th step only (and always the first).
"""

from __future__ import annotations

from tensorflow_elastic.observability import events


class StepReporter:
    """Records the global step every ``every`` steps to the events file (a no-op without one)."""

    def __init__(self, every: int = 10, path: str | None = None, source: str = "worker"):
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.every = every
        self._log = events.EventLog(path, source=source)
        self._last: int | None = None

    def due(self, step: int) -> bool:
        """Whether `report(step, ...)` would record an event (a commit asks before building one)."""
        return self._last is None or step - self._last >= self.every

    def report(self, step: int, world_size: int, node: int | None = None,
               generation: int | None = None) -> None:
        if not self.due(step):
            return
        self._last = step
        self._log.record(events.STEP, node=node, generation=generation, step=step,
                         world_size=world_size)
