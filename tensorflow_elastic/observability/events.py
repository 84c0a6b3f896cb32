"""The shared record of what happened in a job: JSON lines, one event per line.

Every part (orchestrator, agent, workers) appends to the same file, named by
``--events_file`` or the ``TFE_EVENTS_FILE`` environment variable. Benchmarks,
``tfelastic status``, plots and tests read it back with :func:`read_events`.
Each line is written with a single ``write`` on an ``O_APPEND`` descriptor, so
lines from several processes never interleave.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Iterator

from tensorflow_elastic import environment


RENDEZVOUS_COMPLETE = "rendezvous_complete"
FAILURE_DETECTED = "failure_detected"
NODE_JOINED = "node_joined"
NODE_LEFT = "node_left"
GENERATION_START = "generation_start"
STATE_RESTORED = "state_restored"
STATE_SYNCED = "state_synced"
STEP = "step"
JOB_COMPLETE = "job_complete"
# Orchestrator replicas (--store etcd://): one took the lead (after another: a failover), one
# stopped leading.
LEADER_ELECTED = "leader_elected"
ORCHESTRATOR_FAILOVER = "orchestrator_failover"
LEADER_LOST = "leader_lost"


class EventLog:
    """Appends events to one JSON-lines file; a no-op when no path is given."""

    def __init__(self, path: str | None = None, source: str | None = None):
        self.path = path if path is not None else environment.text(environment.EVENTS_FILE)
        self.source = source
        self._lock = threading.Lock()
        self._fd: int | None = None

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def record(self, event: str, node: int | None = None, generation: int | None = None,
               **fields: Any) -> dict[str, Any] | None:
        """Appends one event and returns it (None when the log is disabled)."""
        if self.path is None:
            return None
        entry: dict[str, Any] = {"time": time.time(), "event": event, "node": node,
                                 "generation": generation}
        if self.source is not None:
            entry["source"] = self.source
        entry.update(fields)
        line = (json.dumps(entry, sort_keys=False, default=str) + "\n").encode()
        with self._lock:
            if self._fd is None:
                directory = os.path.dirname(os.path.abspath(self.path))
                os.makedirs(directory, exist_ok=True)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(self._fd, line)
        return entry

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def read_events(path: str, event: str | None = None) -> Iterator[dict[str, Any]]:
    """Yields the events of a file in order, skipping a torn last line."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event is None or entry.get("event") == event:
                yield entry
