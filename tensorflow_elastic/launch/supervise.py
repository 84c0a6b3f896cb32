"""Runs one node's agent in the foreground: a signal stops it gracefully, its summary is printed."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Callable

from tensorflow_elastic.launch.agent import LocalAgent
from tensorflow_elastic.launch.mode import Membership, Mode
from tensorflow_elastic.launch.spec import WorkerSpec
from tensorflow_elastic.launch.worker_metrics import WorkerMetrics


def on_stop_signals(handler: Callable[[int], None]) -> None:
    """``handler(signum)`` runs on SIGTERM and SIGINT (a Ctrl-C reaches only this process)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: handler(signum))


def supervise(spec: WorkerSpec, mode: Mode, wake: threading.Event, why: str,
              membership: Membership | None = None,
              metrics: WorkerMetrics | None = None) -> int:
    """Runs the node's workers to the end; returns the exit code. ``why`` names the mode;
    ``metrics`` gets the figures the workers report."""
    print(f"[agent] {why}", file=sys.stderr, flush=True)
    print(f"[agent] workers' full output: {spec.log_dir}", file=sys.stderr, flush=True)
    agent = LocalAgent(spec, mode, wake, membership, metrics=metrics)
    on_stop_signals(agent.request_stop)
    result = agent.run()
    if result.summary:
        print(result.summary, file=sys.stderr, flush=True)
    if result.failures:
        print(f"[agent] error files and logs: {spec.log_dir}", file=sys.stderr, flush=True)
    return result.exit_code
