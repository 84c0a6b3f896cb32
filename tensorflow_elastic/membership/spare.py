"""A spare worker: started ahead of need, it registers, warms up, then waits for its agent's word.

The launcher (``--spares``) keeps warm worker processes that are not members
of the job, so that a replacement costs only the join and the state transfer,
not TensorFlow's import, the model's build and the step's tracing. The agent
keeps the write end of a pipe and the spare reads the other end
(environment.SPARE_FD): one byte says "needed: join now"; the end of the pipe
(the agent stopped, or the job ended) says it is not needed, and it exits.
"""

from __future__ import annotations

import os
import select
from typing import Callable

from tensorflow_elastic import environment

NEEDED = b"j"
# Seconds between two looks at whether the wait should end for another reason (a SIGTERM).
POLL_S = 0.25


class Spare:
    """The reading end of the agent's pipe."""

    def __init__(self, fd: int):
        self._fd = fd

    @classmethod
    def from_environment(cls) -> Spare | None:
        """The spare this process is, if its agent started it as one."""
        fd = environment.pop(environment.SPARE_FD)
        return None if fd is None else cls(int(fd))

    def wait_until_needed(self, give_up: Callable[[], bool]) -> bool:
        """Blocks until the agent needs this worker (True), or until it never will: the pipe
        ended, or `give_up()` (False). Each look waits at most POLL_S."""
        try:
            while not give_up():
                ready, _, _ = select.select([self._fd], [], [], POLL_S)
                if ready:
                    return os.read(self._fd, 1) == NEEDED
            return False
        finally:
            os.close(self._fd)
