"""The local agent: one per node, it starts, watches and restarts the node's worker processes.

A state machine (see :class:`~tensorflow_elastic.launch.spec.WorkerState`):

    INIT --rendezvous, start--> HEALTHY --all finished--> exit barrier --> SUCCEEDED
                                 |   ^
                     worker died |   | restarted (within --max_restarts)
                                 v   |
                               UNHEALTHY --restarts used up--> FAILED

After every check of its workers the agent asks
:func:`~tensorflow_elastic.launch.decision.decide` what follows and does it.
The mode (:mod:`~tensorflow_elastic.launch.mode`) says how a worker starts
and what a failure restarts; a collective mode's membership joins, reports
and leaves at the orchestrator. A SIGTERM or SIGINT to the agent is forwarded
to the workers as SIGTERM, which an elastic worker turns into a graceful leave.
With ``--spares`` it also keeps warm spare workers (launch/spares.py) once the
job runs, and a dead worker's place goes to one of them. With ``--fork_server`` its workers
are forked from a process that imported TensorFlow once (launch/fork_server.py), started
while the node joins.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
from typing import Callable, Sequence, TextIO

from tensorflow_elastic import environment
from tensorflow_elastic.death_notice import DeathNotice
from tensorflow_elastic.launch import repeats
from tensorflow_elastic.launch.decision import Action, Do, Scope, Situation, decide
from tensorflow_elastic.launch.error_files import WorkerFailure, root_cause_summary
from tensorflow_elastic.launch.gpus import visible_gpus, worker_gpu_env
from tensorflow_elastic.launch.mode import Membership, Mode, SpareLaunches, View, WorkerLaunch
from tensorflow_elastic.launch.preloaded import ForkServer
from tensorflow_elastic.launch.process import WorkerProcess, stop_all
from tensorflow_elastic.launch.spares import RunningSpare, SparePool
from tensorflow_elastic.launch.spec import WorkerSpec, WorkerState, worker_env
from tensorflow_elastic.launch.worker_metrics import WorkerMetrics
from tensorflow_elastic.observability import events
from tensorflow_elastic.observability.progress import ProgressTracker
from tensorflow_elastic.rendezvous import JobCompleteError


@dataclasses.dataclass
class AgentResult:
    """How the agent's run ended; ``exit_code`` is what the launcher exits with."""

    state: WorkerState
    exit_code: int
    restarts: int
    failures: list[WorkerFailure]
    summary: str = ""


class LocalAgent:
    """Runs one node's worker group to the end; :meth:`run` returns how it ended.

    ``membership`` is None when the workers need no orchestrator (the parameter-server roles);
    ``metrics``, when given, gets the figures the workers report.
    """

    def __init__(self, spec: WorkerSpec, mode: Mode, wake: threading.Event,
                 membership: Membership | None = None, stdout: TextIO | None = None,
                 stderr: TextIO | None = None, metrics: WorkerMetrics | None = None):
        self.spec = spec
        self.mode = mode
        self.membership = membership
        self.state = WorkerState.INIT
        self.restarts = 0
        self.failures: list[WorkerFailure] = []
        self._wake = wake
        self._stdout = stdout or sys.stdout
        self._stderr = stderr or sys.stderr
        self._workers: list[WorkerProcess | None] = [None] * spec.nproc_per_node
        self._ended = False
        self._exit_codes: list[int | None] = [None] * spec.nproc_per_node
        # Slots whose worker failed with an error a restart cannot fix.
        self._final: set[int] = set()
        self._pending: list[int] = []  # failed slots the decision has not acted on yet
        self._view = View.unknown(spec.nproc_per_node)
        self._formed: View | None = None  # the nodes this agent joined for its workers
        self._attempt = 0
        self._stop_signal: int | None = None
        self._job_done_at: float | None = None
        self._events = events.EventLog(spec.events_file, source="agent")
        self._progress = ProgressTracker(spec.events_file)
        self._next_progress = time.monotonic() + spec.progress_interval
        self._metrics = metrics
        # The GPUs this launcher hands out to its workers (read once: they do not change).
        self._gpus = visible_gpus()
        self._spares = SparePool()
        self._spare_failures = 0
        self._took_spare: dict[int, int] = {}  # spare number -> the slot it took
        self._fork_server: ForkServer | None = None

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
            self._ended = True  # deaths from here on are the agent's own kills
            self._spares.dismiss(0.0)  # killed, if an ending below did not dismiss them
            for worker in self._workers:
                if worker is not None and worker.poll() is None:
                    worker.kill()
            if self._fork_server is not None:
                self._fork_server.close()
            if self.membership is not None:
                self.membership.close()
            self._events.close()

    def _run(self) -> AgentResult:
        if self.spec.fork_server:  # it imports while the node joins
            self._fork_server = ForkServer(worker_env({}))
            self._info("fork server started: pid %d; workers are forked from it once it has "
                       "imported TensorFlow", self._fork_server.pid)
        if self.spec.rdzv_endpoint:
            self._info("rendezvous at %s (run %s, workers %s)", self.spec.rdzv_endpoint,
                       self.spec.run_id, self.spec.bounds)
        try:
            self._form()
        except JobCompleteError as e:
            # It came after the job's end: nothing is left to run, and nothing failed.
            return self._result(WorkerState.SUCCEEDED, 0, f"{e.message}; no worker started")
        except Exception as e:  # noqa: BLE001 - any rendezvous error ends INIT with its reason
            return self._fail_without_workers(f"rendezvous failed: {e}")
        self._start_all()
        self.state = WorkerState.HEALTHY
        while True:
            self._wake.wait(self.spec.monitor_interval)
            self._wake.clear()
            if self._stop_signal is not None:
                return self._stop(self._stop_signal)
            if self.membership is not None:
                self._view = self.membership.observe()
                self._take_in_reports()
            failed = self._poll()
            self._reap_spares()
            if failed:
                self.state = WorkerState.UNHEALTHY
                for slot in failed:
                    self._record_failure(slot)
            held = bool(self._pending)
            self._pending += failed
            actions = decide(self.mode.scope, self._situation())
            for action in actions:
                result = self._act(action, held)
                if result is not None:
                    return result
            if Do.HOLD not in (action.do for action in actions):
                self._pending = []
                self.state = WorkerState.HEALTHY
            self._stop_stragglers()
            self._report_progress()

    def _situation(self) -> Situation:
        codes = tuple(self._exit_codes)
        pending = [next(f for f in reversed(self.failures) if f.local_rank == slot)
                   for slot in self._pending]
        return Situation(codes, tuple(self._pending), self.restarts, self.spec.max_restarts,
                         self._view.changed, final=tuple(sorted(self._final)),
                         user_error=repeats.user_error(codes, self.failures),
                         awaiting_others=repeats.waits_for_others(codes, pending, time.time()),
                         spares=len(self._spares), spares_wanted=self.spec.spares,
                         job_running=self._view.generation > 0,
                         spare_failures=self._spare_failures)

    def _act(self, action: Action, held: bool) -> AgentResult | None:
        """Does what the decision says (``held``: failed slots were held already); the result
        when it ends the run."""
        if action.do is Do.HOLD:
            if not held:
                self._info("worker(s) %s failed before the first step; the others get up to "
                           "%g s to show whether it is a setup error every worker hits",
                           ", ".join(map(str, self._pending)), repeats.WAIT_FOR_OTHERS_S)
        elif action.do is Do.RESTART_WORKER:
            self.restarts += 1
            # A process that registers elsewhere (the PS mode's) keeps no node to come back as.
            self._info("restart %d of %d: worker %d %s", self.restarts, self.spec.max_restarts,
                       action.slot, f"({self.mode.worker_name}) comes back"
                       if self.mode.worker_name else "comes back as a new node")
            self._view = self._view.with_node(action.slot, None)  # known when it joins
            self._start(action.slot)
        elif action.do is Do.TAKE_SPARE:
            self.restarts += 1
            self._take_spare(action.slot)
        elif action.do is Do.START_SPARE:
            self._start_spare()
        elif action.do is Do.KEEP_DOWN:
            self._info("worker %d is not restarted: %s", action.slot, action.reason)
        elif action.do is Do.RESTART_GROUP:
            # MWMS cannot lose a worker: the whole group (on every node) restarts.
            self.restarts += 1
            self._info("restart %d of %d: restarting all local workers", self.restarts,
                       self.spec.max_restarts)
            return self._restart_group()
        elif action.do is Do.REFORM_GROUP:
            self._info("membership changed: restarting all %d local workers",
                       len(self._workers))
            return self._restart_group()
        elif action.do is Do.FINISH:
            return self._finish()
        else:
            return self._give_up(action.reason, action.exit_code)
        return None

    # ----------------------------------------------------------------- workers

    def _form(self) -> None:
        if self.membership is None:
            return
        self._formed = self.membership.form()
        if self._formed is not None:
            self._view = self._formed

    def _start_all(self) -> None:
        self._attempt += 1
        for slot in range(len(self._workers)):
            self._start(slot)
        if self._formed is not None:
            for node_id in self._formed.node_ids:
                self._events.record(events.GENERATION_START, node=node_id,
                                    generation=self._formed.generation,
                                    world_size=self._formed.world_size, attempt=self._attempt)

    def _start(self, slot: int) -> None:
        worker_dir = os.path.join(self._log_dir(), f"restart_{self.restarts}", f"worker_{slot}")
        extra = worker_gpu_env(slot, self.spec.nproc_per_node, self._gpus, self.spec.gpus)
        extra[environment.LOCAL_RANK] = str(slot)
        self._workers[slot] = self._spawn(self.mode.launch(slot), extra, worker_dir,
                                          lambda slot=slot: self._label(slot))
        self._exit_codes[slot] = None
        self._info("worker %d started: pid %d, %s%s", slot, self._workers[slot].pid,
                   self._who(slot), self._how_started(self._workers[slot]))

    def _start_spare(self) -> None:
        """A spare, which warms up and waits; it reads its end of a pipe for the agent's word."""
        mode: SpareLaunches = self.mode  # type: ignore[assignment] - the launcher checked
        number = self._spares.next_number()
        launch = mode.launch_spare(number)
        read_end, write_end = os.pipe()
        launch.env[environment.SPARE_FD] = str(read_end)
        worker_dir = os.path.join(self._log_dir(), f"spare_{number}")
        try:
            process = self._spawn(launch, {}, worker_dir, lambda: self._spare_label(number),
                                  pass_fds=[read_end])
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        self._spares.add(RunningSpare(number, process, write_end))
        self._info("spare %d started: pid %d%s; it warms up and waits until a worker of this "
                   "node is needed", number, process.pid, self._how_started(process))

    def _take_spare(self, slot: int) -> None:
        """The oldest spare joins in place of `slot`'s dead worker; a new spare comes next."""
        spare = self._spares.take()
        self.mode.adopt_spare(slot, spare.number)  # type: ignore[attr-defined]
        self._took_spare[spare.number] = slot
        self._view = self._view.with_node(slot, None)  # known when it joins
        self._workers[slot] = spare.process
        self._exit_codes[slot] = None
        self._info("restart %d of %d: spare %d (pid %d) joins in place of worker %d",
                   self.restarts, self.spec.max_restarts, spare.number, spare.process.pid, slot)

    def _reap_spares(self) -> None:
        for spare, code in self._spares.reap():
            if code == 0:
                self._info("spare %d exited", spare.number)
                continue
            self._spare_failures += 1
            self._info("spare %d (pid %d) failed with exit code %d before it was needed (%s)",
                       spare.number, spare.process.pid, code,
                       spare.process.log_file or "no log file")

    def _dismiss_spares(self) -> None:
        for spare, code in self._spares.dismiss(self.spec.stop_timeout):
            self._info("spare %d not needed: it left (exit code %d)", spare.number, code)

    def _spawn(self, launch: WorkerLaunch, extra: dict[str, str], worker_dir: str,
               label: Callable[[], str], pass_fds: Sequence[int] = ()) -> WorkerProcess:
        error_file = os.path.join(worker_dir, "error.json")
        if os.path.exists(error_file):
            os.remove(error_file)
        env = dict(launch.env)
        env.update({environment.ERROR_FILE: error_file,
                    environment.RESTART_COUNT: str(self.restarts)})
        env.update(extra)
        if self.spec.events_file:
            env[environment.EVENTS_FILE] = self.spec.events_file
        # A notice for scripts that join in-process (tfe.init holds it); a restart-mode
        # script never would.
        notice = DeathNotice.make() \
            if self.membership is not None and self.mode.scope is Scope.WORKER else None
        if notice is not None:
            env[environment.DEATH_NOTICE_FD] = str(notice.fd)
            pass_fds = [*pass_fds, notice.fd]
        try:
            process = WorkerProcess(self.spec.command(), worker_env(env), error_file, label=label,
                                    stdout=self._stdout, stderr=self._stderr,
                                    pass_fds=[s.fileno() for s in launch.sockets] + list(pass_fds),
                                    log_file=os.path.join(worker_dir, "output.log"),
                                    verbose=self.spec.verbose, on_exit=self._wake.set,
                                    fork_server=self._fork_server)
        finally:
            for held in launch.sockets:
                held.close()
            if notice is not None:
                notice.passed()
        if notice is not None:
            notice.watch(process.pid, lambda: process.poll() is None,
                         lambda: self._death_noticed(process))
        return process

    def _how_started(self, process: WorkerProcess) -> str:
        if self._fork_server is None:
            return ""
        if process.forked:
            return ", forked from the fork server"
        return f", a fresh process ({process.fresh_because})"

    def _death_noticed(self, process: WorkerProcess) -> None:
        """From a death notice's thread: a worker died holding its notice (killed, crashed).
        Its peers may be blocked on it: the orchestrator learns it now, before the kernel has
        freed the process's memory; its exit code and the rest follow when it is reaped."""
        slot = next((i for i, w in enumerate(self._workers) if w is process), None)
        if slot is None or self.membership is None or self._ended \
                or self.membership.finished(slot):  # past its training: no one waits on it
            return
        try:
            self.membership.report_death(slot, "its process died (noticed before it was reaped)")
        except Exception as e:  # noqa: BLE001 - the reap reports it again, or the agent ended
            self._info("early report of worker %d's death failed: %s", slot, e)

    def _spare_label(self, number: int) -> str:
        slot = self._took_spare.get(number)
        return f"spare {number}" if slot is None else self._label(slot)

    def _label(self, slot: int) -> str:
        if self.mode.output_label:
            return self.mode.output_label
        node_id = self._view.node_ids[slot]
        return f"node {node_id}" if node_id is not None else f"worker {slot}"

    def _who(self, slot: int) -> str:
        """The mode's name for its workers, else the slot's node."""
        if self.mode.worker_name:
            return self.mode.worker_name
        node_id = self._view.node_ids[slot]
        return f"node {node_id if node_id is not None else '(assigned when it joins)'}"

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
            if code != 0 and self.membership is not None and self.membership.finished(slot):
                self._info("worker %d (%s) finished its training; its exit then ended with "
                           "code %d, which changes nothing", slot, self._who(slot), code)
                code = 0
            self._exit_codes[slot] = code
            if code == 0:
                self._info("worker %d (%s) finished", slot, self._who(slot))
            else:
                failed.append(slot)
        return failed

    def _stop_stragglers(self) -> None:
        """Once a worker completed the job, the others get --stop_timeout to finish too; a
        replacement still waiting to join a job that is over would otherwise wait forever."""
        if not any(code == 0 for code in self._exit_codes):
            self._job_done_at = None
            return
        if self._job_done_at is None:
            self._job_done_at = time.monotonic()
        elif time.monotonic() - self._job_done_at > self.spec.stop_timeout:
            self._info("the job is complete: stopping the workers still running")
            self._stop_workers()

    def _record_failure(self, slot: int) -> None:
        worker = self._workers[slot]
        failure = WorkerFailure.collect(slot, self._view.node_ids[slot], worker.pid,
                                        self._exit_codes[slot], worker.error_file, worker.tail(),
                                        worker.log_file, self.mode.worker_name,
                                        self._progress.step)
        self.failures.append(failure)
        if not failure.restartable:
            self._final.add(slot)
        self._events.record(events.FAILURE_DETECTED, node=failure.node_id,
                            generation=self._view.generation,
                            failed=[] if failure.node_id is None else [failure.node_id],
                            cause=failure.cause, local_rank=slot, pid=failure.pid)
        if self.membership is not None:
            # Its peers may be blocked on it: the orchestrator learns it now, not at a timeout.
            self._view = self._view.with_node(slot, self.membership.report_death(slot,
                                                                               failure.cause))
        self._info("worker %d (%s, pid %d) failed: %s", slot, self._who(slot), failure.pid,
                   failure.brief)

    def _restart_group(self) -> AgentResult | None:
        self._stop_workers()
        try:
            self._form()
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
        codes = stop_all([worker for _, worker in running], sig, self.spec.stop_timeout)
        for (slot, _), code in zip(running, codes):
            self._exit_codes[slot] = code

    # ------------------------------------------------------------------ endings

    def _finish(self) -> AgentResult:
        # First: the exit barrier waits for every node of the run, spares too.
        self._dismiss_spares()
        if self.membership is not None:
            self.membership.complete()
        self._events.record(events.JOB_COMPLETE, node=None, generation=self._view.generation,
                            restarts=self.restarts)
        summary = ""
        if self.failures:
            summary = root_cause_summary(
                self.failures, f"the job completed; {len(self.failures)} worker failure(s) on "
                               f"this node were survived")
        return self._result(WorkerState.SUCCEEDED, 0, summary)

    def _give_up(self, reason: str, exit_code: int) -> AgentResult:
        self._dismiss_spares()
        self._stop_workers()
        self._leave("the node's workers failed")
        return self._result(WorkerState.FAILED, exit_code,
                            root_cause_summary(self.failures, f"tfelastic-run: {reason}"))

    def _stop(self, signum: int) -> AgentResult:
        name = signal.Signals(signum).name
        self._info("got %s: forwarding SIGTERM to the workers (graceful leave)", name)
        # The workers first: a preemption's grace is theirs, to finish the step and leave.
        self._stop_workers(signal.SIGTERM)
        self._dismiss_spares()
        self._leave(f"agent got {name}")
        if self._formed is not None:
            for node_id in self._formed.node_ids:
                self._events.record(events.NODE_LEFT, node=node_id,
                                    generation=self._formed.generation, reason=name)
        code = 0 if all(c == 0 for c in self._exit_codes) else 128 + signum
        return self._result(WorkerState.STOPPED, code, "")

    def _leave(self, reason: str) -> None:
        if self.membership is not None:
            self.membership.leave(reason)

    def _fail_without_workers(self, reason: str) -> AgentResult:
        return self._result(WorkerState.FAILED, 1, f"tfelastic-run: {reason}")

    def _result(self, state: WorkerState, code: int, summary: str) -> AgentResult:
        self.state = state
        self._info("%s (exit code %d, %d restart(s))", state.value, code, self.restarts)
        return AgentResult(state, code, self.restarts, list(self.failures), summary)

    # ----------------------------------------------------------------- output

    def _log_dir(self) -> str:
        return self.spec.log_dir or "."

    def _take_in_reports(self) -> None:
        """The steps and figures the workers wrote to their node files (a step from the first
        commit on: before it, a failure counts as one before the job's first step)."""
        for record in self._view.records:
            if record is not None and record.step > 0:
                self._progress.note(record.step, record.world_size)
        if self._metrics is not None:
            self._metrics.update(self._view.records)

    def _report_progress(self) -> None:
        """A progress line every --progress_interval seconds (0: none)."""
        if not self.spec.progress_interval or time.monotonic() < self._next_progress:
            return
        self._next_progress = time.monotonic() + self.spec.progress_interval
        line = self._progress.line()
        if line:
            self._info("%s", line)

    def _info(self, fmt: str, *args: object) -> None:
        self._stderr.write("[agent] " + (fmt % args) + "\n")
        self._stderr.flush()
