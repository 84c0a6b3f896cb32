"""What a worker tells the agent that started it: its node id, its generation, its end.

The agent names a file per worker start (environment.NODE_FILE); the worker
rewrites it whenever it gets an id or enters a generation, so the agent knows
whom a dead worker was without asking the orchestrator, and once its training
finished, so that whatever its exit does then (a hang ended by the exit
deadline), the agent counts it finished and never restarts it.
"""

from __future__ import annotations

import dataclasses
import json
import os


@dataclasses.dataclass(frozen=True)
class NodeRecord:
    node_id: int
    generation: int  # 0 while the node waits to join (registered)
    world_size: int
    finished: bool = False  # its training returned and it passed the exit barrier


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
        record = NodeRecord(**raw)
    except (OSError, ValueError, TypeError):
        return None
    counts = (record.node_id, record.generation, record.world_size)
    if not all(type(v) is int and v >= 0 for v in counts) or type(record.finished) is not bool:
        return None
    return record
