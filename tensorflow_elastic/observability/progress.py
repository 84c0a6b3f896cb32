"""One progress line per worker group on long runs: step, world size, steps per second.

The agent learns the step from its workers' node files, and follows the events
file (only the lines appended since its last look) when there is one, instead
of its workers' output: progress works the same for every elastic script, with
or without an events file, and never floods the terminal. A parameter server's
steps (source `ps`) are parameter versions applied for its PS workers, and its
line says so: a PS job has no world.
"""

from __future__ import annotations

import json
import time

from tensorflow_elastic.observability import events

# The source of a parameter server's events (it records under it): its steps are parameter
# versions.
PS_SOURCE = "ps"


class ProgressTracker:
    """Summarizes the steps it is told of (:meth:`note`) and the new `step` events of an
    events file (``path``; None: none) in one line."""

    def __init__(self, path: str | None = None):
        self.path = path
        self._offset = 0
        self._step: int | None = None
        self._world: int | None = None
        self._from_ps = False
        self._last_line_step: int | None = None
        self._last_line_time = time.time()

    def note(self, step: int, world_size: int) -> None:
        """A step a worker reported (an older one than the newest known changes nothing)."""
        if step >= (self._step or 0):
            self._step, self._world = step, world_size

    def _read_new(self) -> None:
        if self.path is None:
            return
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
            if entry.get("event") == events.STEP and isinstance(entry.get("step"), int) \
                    and entry["step"] >= (self._step or 0):
                self._from_ps = entry.get("source") == PS_SOURCE
                self.note(entry["step"], entry.get("workers" if self._from_ps else "world_size",
                                                   self._world))

    @property
    def step(self) -> int | None:
        """The newest step recorded so far (None before the first)."""
        self._read_new()
        return self._step

    def line(self) -> str:
        """'step S, world size W, R steps/s' since the previous line ('' before any step);
        from a PS: 'parameter version V, W PS worker(s), R updates/s'.

        The world size is the job's at that step, as its workers (or the PS) recorded it.
        """
        self._read_new()
        now = time.time()
        if self._step is None:
            return ""
        rate = ""
        unit = "updates/s" if self._from_ps else "steps/s"
        if self._last_line_step is not None and now > self._last_line_time:
            rate = f", {(self._step - self._last_line_step) / (now - self._last_line_time):.2f} {unit}"
        self._last_line_step, self._last_line_time = self._step, now
        if self._from_ps:
            return (f"progress: parameter version {self._step}, "
                    f"{self._world if self._world is not None else '?'} PS worker(s){rate}")
        return f"progress: step {self._step}, world size {self._world or '?'}{rate}"


def recent_step_rate(path: str, window_s: float = 30.0) -> tuple[int, float | None] | None:
    """(latest step, steps/s over the last `window_s` seconds of step events), None without any."""
    # A completed job's last step is in its job_complete events (step events come every N commits).
    steps = [(e["time"], e["step"]) for e in events.read_events(path)
             if e.get("event") in (events.STEP, events.JOB_COMPLETE) and isinstance(e.get("step"), int)]
    if not steps:
        return None
    last_time, last_step = max(steps, key=lambda ts: ts[1])
    recent = [(t, s) for t, s in steps if t >= last_time - window_s]
    first_time, first_step = min(recent)
    if last_time <= first_time:
        return last_step, None
    return last_step, (last_step - first_step) / (last_time - first_time)
