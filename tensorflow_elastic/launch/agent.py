"""The local agent: one per node, it starts, watches and restarts the node's worker processes.

A state machine (see :class:`~tensorflow_elastic.launch.spec.WorkerState`):

    INIT --rendezvous, start--> HEALTHY --all finished--> exit barrier --> SUCCEEDED
                                 |   ^
                     worker died |   | restarted (within --max_restarts)
                                 v   |
                               UNHEALTHY --restarts used up--> FAILED

The elastic part is delegated: :class:`InProcessElasticity` for scripts that
re-form inside their processes (the agent restarts only dead workers) and
:class:`RestartElasticity` for plain MWMS scripts (the agent restarts all its
workers on every membership change). A SIGTERM or SIGINT to the agent is
forwarded to the workers as SIGTERM, which an elastic worker turns into a
graceful leave.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Protocol, TextIO

from tensorflow_elastic import environment
from tensorflow_elastic.launch.error_files import WorkerFailure, root_cause_summary
from tensorflow_elastic.launch.process import WorkerProcess
from tensorflow_elastic.launch.spec import WorkerSpec, WorkerState, worker_env
from tensorflow_elastic.observability import events
from tensorflow_elastic.observability.progress import ProgressTracker


class Elasticity(Protocol):
    """What the agent asks of an elasticity mode."""

    restarts_on_membership_change: bool

    def rendezvous(self) -> object: ...
    def refresh(self) -> None: ...
    def membership_changed(self) -> bool: ...
    def node_id(self, slot: int) -> int | None: ...
    def node_ids(self) -> list[int | None]: ...
    def generation(self) -> int: ...
    def world_size(self) -> int: ...
    def worker_env(self, slot: int) -> dict[str, str]: ...
    def inherited_sockets(self, slot: int) -> list[socket.socket]: ...
    def new_address(self, slot: int) -> None: ...
    def report_death(self, slot: int, cause: str) -> None: ...
    def exit_barrier(self) -> None: ...
    def leave(self, reason: str) -> None: ...
    def close(self) -> None: ...


@dataclasses.dataclass
class AgentResult:
    """How the agent's run ended; ``exit_code`` is what the launcher exits with."""

    state: WorkerState
    exit_code: int
    restarts: int
    failures: list[WorkerFailure]
    summary: str = ""


class LocalAgent:
    """Runs one node's worker group to the end; :meth:`run` returns how it ended."""

    def __init__(self, spec: WorkerSpec, elasticity: Elasticity, wake: threading.Event,
                 stdout: TextIO | None = None, stderr: TextIO | None = None):
        self.spec = spec
        self.elasticity = elasticity
        self.state = WorkerState.INIT
        self.restarts = 0
        self.failures: list[WorkerFailure] = []
        self._wake = wake
        self._stdout = stdout or sys.stdout
        self._stderr = stderr or sys.stderr
        self._workers: list[WorkerProcess | None] = [None] * spec.nproc_per_node
        self._exit_codes: list[int | None] = [None] * spec.nproc_per_node
        self._attempt = 0
        self._stop_signal: int | None = None
        self._job_done_at: float | None = None
        self._events = events.EventLog(spec.events_file, source="agent")
        self._progress = ProgressTracker(spec.events_file) if spec.events_file else None
        self._next_progress = time.monotonic() + spec.progress_interval

    # ------------------------------------------------------------------ control

    def request_stop(self, signum: int) -> None:
        """Called from a signal handler: the loop forwards SIGTERM to the workers and ends."""
        self._stop_signal = signum
        self._wake.set()

    @property
    def worker_pids(self) -> list[int | None]:
        return [w.pid if w is not None else None for w in self._workers]

    def run(self) -> AgentResult:
        try:
            return self._run()
        finally:
            for worker in self._workers:
                if worker is not None and worker.poll() is None:
                    worker.kill()
            self.elasticity.close()
            self._events.close()

    def _run(self) -> AgentResult:
        if self.spec.rdzv_endpoint:
            self._info("rendezvous at %s (run %s, workers %d:%d)", self.spec.rdzv_endpoint,
                       self.spec.run_id, self.spec.min_nodes, self.spec.max_nodes)
        try:
            self.elasticity.rendezvous()
        except Exception as e:  # noqa: BLE001 - any rendezvous error ends INIT with its reason
            return self._fail_without_workers(f"rendezvous failed: {e}")
        self._start_all()
        self.state = WorkerState.HEALTHY
        while True:
            self._wake.wait(self.spec.monitor_interval)
            self._wake.clear()
            if self._stop_signal is not None:
                return self._stop(self._stop_signal)
            self.elasticity.refresh()
            newly_failed = self._poll()
            if newly_failed:
                result = self._on_failures(newly_failed)
                if result is not None:
                    return result
            elif (self.elasticity.restarts_on_membership_change and not self._any_succeeded()
                  and self.elasticity.membership_changed()):
                self._info("membership changed: restarting all %d local workers",
                           len(self._workers))
                result = self._restart_group()
                if result is not None:
                    return result
            if all(code is not None for code in self._exit_codes):
                return self._finish()
            self._stop_stragglers()
            self._report_progress()

    # ----------------------------------------------------------------- workers

    def _start_all(self) -> None:
        self._attempt += 1
        for slot in range(len(self._workers)):
            self._start(slot)
        if self.elasticity.restarts_on_membership_change:
            for node_id in self.elasticity.node_ids():
                self._events.record(events.GENERATION_START, node=node_id,
                                    generation=self.elasticity.generation(),
                                    world_size=self.elasticity.world_size(),
                                    attempt=self._attempt)

    def _start(self, slot: int) -> None:
        worker_dir = os.path.join(self._log_dir(), f"restart_{self.restarts}", f"worker_{slot}")
        error_file = os.path.join(worker_dir, "error.json")
        if os.path.exists(error_file):
            os.remove(error_file)
        extra = self.elasticity.worker_env(slot)
        extra.update({environment.ERROR_FILE: error_file, environment.LOCAL_RANK: str(slot),
                      environment.RESTART_COUNT: str(self.restarts)})
        if self.spec.events_file:
            extra[environment.EVENTS_FILE] = self.spec.events_file
        inherited = self.elasticity.inherited_sockets(slot)
        try:
            worker = WorkerProcess(self.spec.command(), worker_env(extra), error_file,
                                   label=lambda slot=slot: self._label(slot),
                                   stdout=self._stdout, stderr=self._stderr,
                                   pass_fds=[s.fileno() for s in inherited],
                                   log_file=os.path.join(worker_dir, "output.log"),
                                   verbose=self.spec.verbose, on_exit=self._wake.set)
        finally:
            for held in inherited:
                held.close()
        self._workers[slot] = worker
        self._exit_codes[slot] = None
        self._info("worker %d started: pid %d, node %s", slot, worker.pid,
                   self._node_text(slot))

    def _label(self, slot: int) -> str:
        node_id = self.elasticity.node_id(slot)
        return f"node {node_id}" if node_id is not None else f"worker {slot}"

    def _node_text(self, slot: int) -> str:
        node_id = self.elasticity.node_id(slot)
        return str(node_id) if node_id is not None else "(assigned when it joins)"

    def _poll(self) -> list[int]:
        """Slots whose worker just ended with a non-zero code."""
        failed = []
        for slot, worker in enumerate(self._workers):
            if worker is None or self._exit_codes[slot] is not None:
                continue
            code = worker.poll()
            if code is None:
                continue
            worker.wait_output()
            self._exit_codes[slot] = code
            if code == 0:
                self._info("worker %d (node %s) finished", slot, self._node_text(slot))
            else:
                failed.append(slot)
        return failed

    def _stop_stragglers(self) -> None:
        """Once a worker completed the job, the others get --stop_timeout to finish too; a
        replacement still waiting to join a job that is over would otherwise wait forever."""
        if not self._any_succeeded():
            self._job_done_at = None
            return
        if self._job_done_at is None:
            self._job_done_at = time.monotonic()
        elif time.monotonic() - self._job_done_at > self.spec.stop_timeout:
            self._info("the job is complete: stopping the workers still running")
            self._stop_workers()

    def _any_succeeded(self) -> bool:
        return any(code == 0 for code in self._exit_codes)

    def _record_failure(self, slot: int) -> WorkerFailure:
        worker = self._workers[slot]
        failure = WorkerFailure.collect(slot, self.elasticity.node_id(slot), worker.pid,
                                        self._exit_codes[slot], worker.error_file, worker.tail(),
                                        worker.log_file)
        self.failures.append(failure)
        self._events.record(events.FAILURE_DETECTED, node=failure.node_id,
                            generation=self.elasticity.generation(),
                            failed=[] if failure.node_id is None else [failure.node_id],
                            cause=failure.cause, local_rank=slot, pid=failure.pid)
        # Its peers may be blocked on it: the orchestrator learns it now, not at a timeout.
        self.elasticity.report_death(slot, failure.cause)
        self._info("worker %d (node %s, pid %d) failed: %s", slot, self._node_text(slot),
                   failure.pid, failure.cause)
        return failure

    def _on_failures(self, slots: list[int]) -> AgentResult | None:
        self.state = WorkerState.UNHEALTHY
        for slot in slots:
            self._record_failure(slot)
        if self.elasticity.restarts_on_membership_change:
            # MWMS cannot lose a worker: the whole group (on every node) restarts.
            if self.restarts >= self.spec.max_restarts:
                return self._give_up()
            self.restarts += 1
            self._info("restart %d of %d: restarting all local workers", self.restarts,
                       self.spec.max_restarts)
            return self._restart_group()
        # In-process elasticity: the others go on; only the dead workers come back.
        for slot in slots:
            if self._any_succeeded():
                self._info("worker %d is not restarted: the job is complete", slot)
                continue
            if self.restarts >= self.spec.max_restarts:
                self._info("worker %d is not restarted: --max_restarts=%d used up", slot,
                           self.spec.max_restarts)
                continue
            self.restarts += 1
            self._info("restart %d of %d: worker %d comes back as a new node", self.restarts,
                       self.spec.max_restarts, slot)
            self.elasticity.new_address(slot)
            self._start(slot)
        if all(code is not None for code in self._exit_codes) and not self._any_succeeded():
            return self._give_up()
        self.state = WorkerState.HEALTHY
        return None

    def _restart_group(self) -> AgentResult | None:
        self._stop_workers()
        try:
            self.elasticity.rendezvous()
        except Exception as e:  # noqa: BLE001 - the run cannot go on; say why
            self.state = WorkerState.FAILED
            return self._result(WorkerState.FAILED, 1, f"re-rendezvous failed: {e}")
        self._start_all()
        self.state = WorkerState.HEALTHY
        return None

    def _stop_workers(self, sig: int = signal.SIGTERM) -> None:
        """Signals every running worker, then waits for them (SIGKILL after --stop_timeout)."""
        running = [(slot, w) for slot, w in enumerate(self._workers)
                   if w is not None and self._exit_codes[slot] is None]
        for _, worker in running:
            worker.signal(sig)
        deadline = time.monotonic() + self.spec.stop_timeout
        for slot, worker in running:
            try:
                worker.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.kill()
            self._exit_codes[slot] = worker.wait_output()

    # ------------------------------------------------------------------ endings

    def _finish(self) -> AgentResult:
        if not self._any_succeeded():
            return self._give_up()
        self.elasticity.exit_barrier()
        if self.elasticity.restarts_on_membership_change:
            self.elasticity.leave("job complete")
        self._events.record(events.JOB_COMPLETE, node=None, generation=self.elasticity.generation(),
                            restarts=self.restarts)
        summary = ""
        if self.failures:
            summary = root_cause_summary(
                self.failures, f"the job completed; {len(self.failures)} worker failure(s) on "
                               f"this node were survived")
        return self._result(WorkerState.SUCCEEDED, 0, summary)

    def _give_up(self) -> AgentResult:
        self._stop_workers()
        self.elasticity.leave("the node's workers failed")
        return self._result(
            WorkerState.FAILED, 1,
            root_cause_summary(self.failures, f"tfelastic-run: workers failed on this node after "
                                              f"{self.restarts} restart(s) "
                                              f"(--max_restarts={self.spec.max_restarts})"))

    def _stop(self, signum: int) -> AgentResult:
        name = signal.Signals(signum).name
        self._info("got %s: forwarding SIGTERM to the workers (graceful leave)", name)
        self._stop_workers(signal.SIGTERM)
        self.elasticity.leave(f"agent got {name}")
        if self.elasticity.restarts_on_membership_change:
            for node_id in self.elasticity.node_ids():
                self._events.record(events.NODE_LEFT, node=node_id,
                                    generation=self.elasticity.generation(), reason=name)
        code = 0 if all(c == 0 for c in self._exit_codes) else 128 + signum
        return self._result(WorkerState.STOPPED, code, "")

    def _fail_without_workers(self, reason: str) -> AgentResult:
        return self._result(WorkerState.FAILED, 1, f"tfelastic-run: {reason}")

    def _result(self, state: WorkerState, code: int, summary: str) -> AgentResult:
        self.state = state
        self._info("%s (exit code %d, %d restart(s))", state.value, code, self.restarts)
        return AgentResult(state, code, self.restarts, list(self.failures), summary)

    # ----------------------------------------------------------------- output

    def _log_dir(self) -> str:
        return self.spec.log_dir or "."

    def _report_progress(self) -> None:
        if self._progress is None or time.monotonic() < self._next_progress:
            return
        self._next_progress = time.monotonic() + self.spec.progress_interval
        line = self._progress.line()
        if line:
            self._info("%s", line)

    def _info(self, fmt: str, *args: object) -> None:
        self._stderr.write("[agent] " + (fmt % args) + "\n")
        self._stderr.flush()
