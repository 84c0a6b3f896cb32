"""The progress watchdog: a member whose training stopped committing, seen from its own thread.

A member can hang while its heartbeat thread beats on: a deadlock, a loop, a
stuck callback or input pipeline. Its heartbeats keep it in the job while
every other member waits for it in their next collective. The watchdog runs in
a thread of its own (not in the heartbeat thread, whose calls may be slow) and,
after ``timeout`` seconds without a commit, looks at where the main thread is:

* outside TensorFlow (in Python: the script, a lock, a sleep): this member is
  the one stuck. ``on_stuck(reason)`` runs once, with the main thread's stack
  in the reason; the session then steps aside (see MembershipSession).
* inside TensorFlow (waiting for peers in a collective, or for its input): it
  waits a second ``timeout`` so that a peer stuck in Python steps aside first,
  then ``on_stalled(reason)`` runs; the session aborts its collectives and the
  members re-form, and a member that never reaches the next barrier is removed
  at the barrier timeout.

Well before that, every ``slow_after`` seconds without a commit while the main
thread waits in TensorFlow, ``on_slow(reason)`` runs: the session probes its
peers, so that a peer this member cannot reach while it still reaches the
orchestrator (a partition between two hosts) is reported in seconds.

TensorFlow-free: it recognises TensorFlow's frames by their file's directory.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from typing import Callable

logger = logging.getLogger(__name__)

Listener = Callable[[str], None]


class ProgressWatchdog:
    def __init__(self, timeout: float, on_stuck: Listener, on_stalled: Listener,
                 paused: Callable[[], bool] = lambda: False,
                 on_slow: Listener | None = None, slow_after: float = float("inf")):
        """``paused()`` is true while the member legitimately makes no progress (re-forming)."""
        if timeout <= 0:
            raise ValueError(f"the progress timeout must be positive, got {timeout:g} s")
        self.timeout = timeout
        self._on_stuck = on_stuck
        self._on_stalled = on_stalled
        self._paused = paused
        self._on_slow = on_slow
        self.slow_after = slow_after
        self._last: float | None = None
        self._slow_told: float | None = None  # when on_slow last ran in this stall
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="tfe-watchdog", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def progress(self) -> None:
        """A commit: training goes on (the watchdog is armed from the first one)."""
        self._last = time.monotonic()

    def restart(self) -> None:
        """A re-form ended: the time it took is no lack of progress."""
        if self._last is not None:
            self._last = time.monotonic()

    def check(self, now: float) -> None:
        """Acts if the member made no progress for too long; the thread calls it every second."""
        last = self._last
        if last is None or self._paused():
            return
        idle = now - last
        if idle <= self.timeout:
            self._check_slow(last, now)
            return  # the common case, every second: no stack to take (~0.2 ms at 40 frames)
        stack = main_thread_stack()
        if stack and not in_tensorflow(stack):
            self._last = now
            self._on_stuck(f"no commit for {idle:.0f} s and the main thread is not in "
                           f"TensorFlow; it is at:\n{''.join(traceback.format_list(stack[-8:]))}")
        elif idle > 2 * self.timeout:
            self._last = now
            self._on_stalled(f"no commit for {idle:.0f} s while the main thread waits in "
                             f"TensorFlow; a peer may hang without having failed")

    def _check_slow(self, last: float, now: float) -> None:
        """``on_slow`` every ``slow_after`` seconds of a stall inside TensorFlow."""
        if self._on_slow is None or now - max(last, self._slow_told or last) <= self.slow_after:
            return
        stack = main_thread_stack()
        if stack and in_tensorflow(stack):
            self._slow_told = now
            self._on_slow(f"no commit for {now - last:.0f} s while the main thread waits in "
                          f"TensorFlow")

    def _loop(self) -> None:
        while not self._stop.wait(min(1.0, self.timeout / 10)):
            try:
                self.check(time.monotonic())
            except Exception:  # noqa: BLE001 - the watchdog must outlive its listeners' bugs
                logger.exception("progress watchdog check failed")


def main_thread_stack() -> traceback.StackSummary | None:
    """Where the main thread is now (innermost frame last); None if it has ended."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    return None if frame is None else traceback.extract_stack(frame)


def in_tensorflow(stack: traceback.StackSummary) -> bool:
    """Whether the innermost frame of ``stack`` is TensorFlow's (running or awaiting an op)."""
    tensorflow = sys.modules.get("tensorflow")
    path = getattr(tensorflow, "__file__", None)
    if not path or not stack:
        return False
    return os.path.abspath(stack[-1].filename).startswith(os.path.dirname(path) + os.sep)
