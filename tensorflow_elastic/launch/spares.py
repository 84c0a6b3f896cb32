"""The agent's warm spares (``--spares``): worker processes started ahead of need.

A spare runs the script like any worker, registers at the orchestrator
without joining, builds and warms up its step, then waits
(membership/spare.py). When a worker of the node dies, the agent takes a
spare in its place: one byte on the spare's pipe and it joins, with the
import, build and tracing already behind it. Closing the pipe tells a spare it
is not needed: it leaves and exits 0.
"""

from __future__ import annotations

import dataclasses
import os
import signal

from tensorflow_elastic.launch.process import WorkerProcess, stop_all
from tensorflow_elastic.membership.spare import NEEDED


@dataclasses.dataclass
class RunningSpare:
    number: int  # the launcher's count of spares started, for its label and files
    process: WorkerProcess
    pipe: int  # the write end: NEEDED, or closed


class SparePool:
    """The spares that run, oldest first."""

    def __init__(self) -> None:
        self._running: list[RunningSpare] = []
        self.started = 0

    def __len__(self) -> int:
        return len(self._running)

    def next_number(self) -> int:
        self.started += 1
        return self.started - 1

    def add(self, spare: RunningSpare) -> None:
        self._running.append(spare)

    def reap(self) -> list[tuple[RunningSpare, int]]:
        """The spares that exited since the last look, with their exit codes."""
        ended = [(spare, code) for spare in self._running
                 if (code := spare.process.poll()) is not None]
        for spare, _ in ended:
            self._running.remove(spare)
            os.close(spare.pipe)
            spare.process.wait_output()
        return ended

    def take(self) -> RunningSpare:
        """The oldest spare (the warmest), told to join now; it is no longer a spare."""
        spare = self._running.pop(0)
        try:
            os.write(spare.pipe, NEEDED)
        except BrokenPipeError:
            pass  # it died meanwhile: the agent sees its exit as the slot's worker's failure
        os.close(spare.pipe)
        return spare

    def dismiss(self, grace: float) -> list[tuple[RunningSpare, int]]:
        """Tells every spare it is not needed (its pipe ends; a SIGTERM for one that has not
        reached its wait yet: it leaves once it does, or ends at once while it still imports)
        and waits up to `grace` seconds for each to exit; one that does not is killed. Returns
        them with their exit codes."""
        for spare in self._running:
            os.close(spare.pipe)
        codes = stop_all([spare.process for spare in self._running], signal.SIGTERM, grace)
        dismissed = list(zip(self._running, codes))
        self._running = []
        return dismissed
