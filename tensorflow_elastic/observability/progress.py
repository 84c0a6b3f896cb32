"""One progress line per worker group on long runs: step, world size, steps per second.

The agent follows the events file (only the lines appended since its last
look) instead of its workers' output, so progress works the same for every
script that records `step` events and never floods the terminal.
"""

from __future__ import annotations

import json
import time

from tensorflow_elastic import events


class ProgressTracker:
    """Reads new `step` events of an events file and summarizes them in one line."""

    def __init__(self, path: str):
        self.path = path
        self._offset = 0
        self._step: int | None = None
        self._last_line_step: int | None = None
        self._last_line_time = time.time()

    def _read_new(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1  # a torn last line is read next time, whole
        self._offset += end
        for raw in data[:end].splitlines():
            try:
                entry = json.loads(raw)
            except ValueError:
                continue
            if entry.get("event") == events.STEP and isinstance(entry.get("step"), int):
                self._step = max(self._step or 0, entry["step"])

    def line(self, world_size: int) -> str:
        """'step S, world size W, R steps/s' since the previous line ('' before any step)."""
        self._read_new()
        now = time.time()
        if self._step is None:
            return ""
        rate = ""
        if self._last_line_step is not None and now > self._last_line_time:
            rate = f", {(self._step - self._last_line_step) / (now - self._last_line_time):.2f} steps/s"
        self._last_line_step, self._last_line_time = self._step, now
        return f"progress: step {self._step}, world size {world_size}{rate}"
