"""What a worker tells the agent that started it: its node id, generation, progress and end.

The agent names a file per worker start (environment.NODE_FILE); the worker
rewrites it whenever it gets an id or enters a generation, and at most once a
second as it commits, so the agent knows whom a dead worker was without asking
the orchestrator, and serves its workers' metrics and progress lines without an
events file; and once its training finished, so that whatever its exit does then
(a hang ended by the exit deadline), the agent counts it finished and never
restarts it. The file is small and local: rewriting it costs microseconds.
"""

from __future__ import annotations

import dataclasses
import json
import os

# The durations of a worker's latest recoveries the file keeps (the agent reads it far
# more often than recoveries happen).
RECENT_RECOVERIES = 16


@dataclasses.dataclass(frozen=True)
class NodeRecord:
    node_id: int
    generation: int  # 0 while the node waits to join (registered)
    world_size: int
    step: int = 0  # the job's commits, as this worker last counted them
    recoveries: int = 0  # failures this worker recovered from
    recovery_seconds: tuple[float, ...] = ()  # the latest recoveries' durations, oldest first
    lost_steps: int = 0  # steps redone after its recoveries
    sync_bytes: int = 0  # state bytes it sent or received in syncs
    finished: bool = False  # its training returned and it passed the exit barrier


@dataclasses.dataclass
class Progress:
    """A worker's running counts, which every record it writes carries."""

    step: int = 0
    recoveries: int = 0
    recovery_seconds: list[float] = dataclasses.field(default_factory=list)
    lost_steps: int = 0
    sync_bytes: int = 0

    def recovered(self, seconds: float, lost_steps: int) -> None:
        self.recoveries += 1
        self.recovery_seconds = (self.recovery_seconds + [seconds])[-RECENT_RECOVERIES:]
        self.lost_steps += lost_steps

    def record(self, node_id: int, generation: int, world_size: int,
               finished: bool = False) -> NodeRecord:
        return NodeRecord(node_id, generation, world_size, self.step, self.recoveries,
                          tuple(self.recovery_seconds), self.lost_steps, self.sync_bytes,
                          finished)


def write(path: str, record: NodeRecord) -> None:
    """Replaces the file at once: the agent never reads half a record."""
    temporary = f"{path}.tmp"
    with open(temporary, "w") as f:
        json.dump(dataclasses.asdict(record), f)
    os.replace(temporary, path)


def read(path: str) -> NodeRecord | None:
    """The record, or None when the worker has not written one (or the file is not one)."""
    try:
        with open(path) as f:
            raw = json.load(f)
        durations = raw.pop("recovery_seconds", [])
        record = NodeRecord(**raw, recovery_seconds=tuple(durations))
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    counts = [getattr(record, field.name) for field in dataclasses.fields(record)
              if field.name not in ("recovery_seconds", "finished")]
    if not all(type(v) is int and v >= 0 for v in counts) or type(record.finished) is not bool:
        return None
    if len(durations) > RECENT_RECOVERIES or not all(
            type(s) in (int, float) and s >= 0 for s in durations):
        return None
    return record
