"""``tensorflowrun``: one command for a multi-host elastic job on hosts that come and go.

    tensorflowrun --min_nodes 2 --max_nodes 4 --discovery ./discover.sh python train.py
    tensorflowrun -np 4 --min-np 2 --host-discovery-script ./discover.sh python train.py

It serves the orchestrator itself and, every ``--discovery_interval``
seconds, asks the discovery script (and the hostfile) which hosts are up. It
starts a ``tfelastic-run`` agent on each new host (a subprocess on this
machine, ``ssh`` elsewhere) with as many workers as the host has slots,
stops the agent of a host that vanished (SIGTERM: its workers leave
gracefully), and puts a host whose agent failed on a cooldown. It ends when
an agent reports the job complete, or when the orchestrator fails the run.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import NoReturn

from tensorflow_elastic import __version__, environment
from tensorflow_elastic.launch import embedded
from tensorflow_elastic.launch.flags import LauncherArgumentParser
from tensorflow_elastic.launch import hosts as hosts_lib
from tensorflow_elastic.launch.process import WorkerProcess
from tensorflow_elastic.launch.spec import AUTO, IN_PROCESS, RESTART, worker_env
from tensorflow_elastic.observability import prometheus
from tensorflow_elastic.rendezvous import Client, Phase, RendezvousError, auth
from tensorflow_elastic.rendezvous.types import NodeBounds

PROG = "tensorflowrun"
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")


_EPILOG = """\
Discovery output and hostfile lines: 'host:slots' (also 'host slots=N', or
'host' for one slot). Hosts that name this machine (localhost, 127.x, its
hostname) run agents as subprocesses; others need passwordless ssh and the
same Python environment and working directory.

Every multi-word flag takes both spellings (--min-nodes or --min_nodes); the
horovodrun names -np, --min-np, --max-np and --host-discovery-script work too.

exit codes:
  0        an agent reported the job complete and the others finished
  1        the job failed: the orchestrator failed the run, no agent ran for
           --idle_timeout, or agents did not finish
  2        a bad argument; nothing was started
  128+S    stopped by signal S (130: Ctrl-C, 143: SIGTERM)
"""


def build_parser() -> argparse.ArgumentParser:
    p = LauncherArgumentParser(prog=PROG, description=__doc__, epilog=_EPILOG,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("-np", "--num_proc", dest="np", type=int, metavar="N",
                   help="worker processes of the job, as horovodrun -np: the default of "
                   "--min_nodes and --max_nodes (alone, a job of fixed size)")
    p.add_argument("--min_nodes", "--min_np", type=int, metavar="N",
                   help="worker processes the job needs to run (default: -np)")
    p.add_argument("--max_nodes", "--max_np", type=int, metavar="N",
                   help="worker processes the job may grow to (default: -np)")
    p.add_argument("--discovery", "--discovery_script", "--host_discovery_script",
                   metavar="SCRIPT",
                   help="executable that prints the available hosts, one 'host:slots' per line")
    p.add_argument("--hostfile", metavar="FILE", help="hosts that are always available")
    p.add_argument("--discovery_interval", type=float, default=5.0, metavar="S",
                   help="seconds between discovery runs (default: %(default)s)")
    p.add_argument("--cooldown", type=float, default=30.0, metavar="S",
                   help="seconds a host whose agent failed is left alone; doubles with each "
                   "failure (default: %(default)s)")
    p.add_argument("--max_cooldown", type=float, default=600.0, metavar="S",
                   help="longest cooldown (default: %(default)s)")
    p.add_argument("--rdzv_endpoint", default="127.0.0.1:0", metavar="HOST:PORT",
                   help="where to serve the orchestrator; use an address the other hosts reach "
                   "(default: %(default)s, a free port, this machine only)")
    p.add_argument("--run_id", default="default", metavar="ID", help="the job's name")
    p.add_argument("--token_file", metavar="FILE",
                   help="the orchestrator's shared token (first line); agents get the same path, "
                   f"so on several hosts keep it on a shared file system (default: "
                   f"${environment.TOKEN} if set, passed to local agents only)")
    p.add_argument("--tls_cert", metavar="PEM",
                   help="serve the orchestrator with TLS (needs --tls_key); agents and workers "
                   "trust this certificate (same path on every host)")
    p.add_argument("--tls_key", metavar="PEM", help="the private key of --tls_cert")
    p.add_argument("--insecure", action="store_true",
                   help="allow a non-loopback --rdzv_endpoint without a token")
    p.add_argument("--events_file", metavar="PATH",
                   help=f"the job's events file (default: ${environment.EVENTS_FILE} if set)")
    p.add_argument("--max_restarts", type=int, default=3, metavar="N",
                   help="worker restarts per agent (default: %(default)s)")
    prometheus.add_flags(p, "the embedded orchestrator's: members, generation, rendezvous "
                         "durations, RPCs")
    p.add_argument("--monitor_interval", type=float, default=1.0, metavar="S",
                   help="agents' check interval (default: %(default)s)")
    p.add_argument("--elastic_mode", choices=[AUTO, IN_PROCESS, RESTART], default=AUTO,
                   help="passed to every agent (default: %(default)s)")
    p.add_argument("--idle_timeout", type=float, default=300.0, metavar="S",
                   help="give up after this many seconds with no agent running "
                   "(default: %(default)s)")
    p.add_argument("--stop_timeout", type=float, default=30.0, metavar="S",
                   help="seconds an agent gets to stop after SIGTERM (default: %(default)s)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="[python] SCRIPT ARGS",
                   help="the training script and its arguments")
    return p


@dataclasses.dataclass
class HostAgent:
    host: str
    slots: int
    process: WorkerProcess
    stopping: bool = False


class Supervisor:
    """Keeps one agent on every available host until the job completes or fails."""

    def __init__(self, args: argparse.Namespace, endpoint: str, script: list[str],
                 token: str | None):
        self.args = args
        self.endpoint = endpoint
        self.script = script
        self.cooldown = hosts_lib.Cooldown(args.cooldown, args.max_cooldown)
        self.agents: dict[str, HostAgent] = {}
        self._discovered: dict[str, int] = {}
        self._stop = threading.Event()
        self._signal: int | None = None
        self._status = Client(endpoint, args.run_id, token, tls_ca=args.tls_cert,
                              retry_timeout=5.0)

    def request_stop(self, signum: int) -> None:
        self._signal = signum
        self._stop.set()

    def run(self) -> int:
        idle_since = time.monotonic()
        try:
            while True:
                completed = self._reap()
                if completed:
                    self._log("an agent reports the job complete; waiting for the others")
                    return 0 if self._wait_all(self.args.stop_timeout * 2) else 1
                available = self._available()
                self._stop_vanished(available)
                self._start_new(available)
                if self._run_failed():
                    return 1
                if self.agents:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > self.args.idle_timeout:
                    self._log(f"no agent ran for {self.args.idle_timeout:g} s (hosts available: "
                              f"{sorted(available) or 'none'}); giving up")
                    return 1
                if self._stop.wait(self.args.discovery_interval):
                    self._log(f"got {signal.Signals(self._signal).name}: stopping every agent")
                    return 128 + self._signal
        finally:
            self._stop_all()
            self._status.close()

    # ---------------------------------------------------------------- agents

    def _available(self) -> dict[str, int]:
        hosts = hosts_lib.read_hostfile(self.args.hostfile) if self.args.hostfile else {}
        if self.args.discovery:
            try:
                self._discovered = hosts_lib.run_discovery(self.args.discovery)
            except (RuntimeError, ValueError) as e:
                self._log(f"{e}; keeping the hosts found last time")
            hosts.update(self._discovered)
        return hosts

    def _reap(self) -> bool:
        """Forgets agents that ended; True if one finished the job."""
        completed = False
        for host, agent in list(self.agents.items()):
            code = agent.process.poll()
            if code is None:
                continue
            agent.process.wait_output()
            del self.agents[host]
            if agent.stopping:
                self._log(f"agent on {host} stopped")
            elif code == 0:
                completed = True
            else:
                seconds = self.cooldown.record_failure(host)
                self._log(f"agent on {host} failed with exit code {code}; {host} cools down "
                          f"for {seconds:g} s")
        return completed

    def _stop_vanished(self, available: dict[str, int]) -> None:
        for host, agent in self.agents.items():
            if host not in available and not agent.stopping:
                self._log(f"{host} is gone from discovery: stopping its agent")
                agent.process.signal(signal.SIGTERM)
                agent.stopping = True

    def _start_new(self, available: dict[str, int]) -> None:
        used = sum(a.slots for a in self.agents.values() if not a.stopping)
        for host, slots in sorted(available.items()):
            if host in self.agents or self.cooldown.cooling(host):
                continue
            slots = min(slots, self.args.max_nodes - used)
            if slots < 1:
                return
            self._log(f"starting an agent on {host} with {slots} worker(s)")
            process = WorkerProcess(self._agent_command(host, slots), worker_env({}), "",
                                    label=lambda host=host: host)
            self.agents[host] = HostAgent(host, slots, process)
            used += slots

    def _agent_command(self, host: str, slots: int) -> list[str]:
        args = self.args
        launch = ["-m", "tensorflow_elastic.launch.launcher",
                  "--rdzv_endpoint", self.endpoint, "--run_id", args.run_id,
                  "--nworkers", f"{args.min_nodes}:{args.max_nodes}",
                  "--nproc_per_node", str(slots), "--address", _bracketed(host),
                  "--max_restarts", str(args.max_restarts),
                  "--monitor_interval", str(args.monitor_interval),
                  "--stop_timeout", str(args.stop_timeout), "--elastic_mode", args.elastic_mode]
        if args.events_file:
            launch += ["--events_file", args.events_file]
        if args.token_file:
            launch += ["--token_file", args.token_file]
        if args.tls_cert:
            launch += ["--tls_ca", args.tls_cert]
        if hosts_lib.is_local(host):
            return [sys.executable, *launch, *self.script]
        remote = f"cd {shlex.quote(os.getcwd())} && " + shlex.join(["python3", *launch, *self.script])
        return ["ssh", "-o", "BatchMode=yes", "-tt", host, remote]

    def _wait_all(self, timeout: float) -> bool:
        """Waits for the remaining agents to finish; True if every one exited 0."""
        deadline = time.monotonic() + timeout
        ok = True
        for host, agent in list(self.agents.items()):
            try:
                code = agent.process.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:  # the rest are stopped in _stop_all
                self._log(f"agent on {host} did not finish in time")
                return False
            agent.process.wait_output()
            ok = ok and (code == 0 or agent.stopping)
            del self.agents[host]
        return ok

    def _stop_all(self) -> None:
        for agent in self.agents.values():
            agent.process.signal(signal.SIGTERM)
        for agent in self.agents.values():
            agent.process.stop(self.args.stop_timeout)
        self.agents.clear()

    def _run_failed(self) -> bool:
        try:
            runs = self._status.status()
        except RendezvousError:
            return False  # no node joined yet
        failed = [r for r in runs if r.state == Phase.FAILED]
        if failed:
            self._log(f"the orchestrator failed the run: {failed[0].reason}")
        return bool(failed)

    def _log(self, message: str) -> None:
        print(f"[{PROG}] {message}", file=sys.stderr, flush=True)


def _die(message: str) -> NoReturn:
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def _bracketed(host: str) -> str:
    """An IPv6 host in brackets, so that the agent does not read its last group as a port."""
    return f"[{host}]" if ":" in host else host


def job_bounds(args: argparse.Namespace) -> NodeBounds:
    """The job's worker bounds: --min_nodes and --max_nodes, each -np when not given."""
    low = args.np if args.min_nodes is None else args.min_nodes
    high = args.np if args.max_nodes is None else args.max_nodes
    if low is None or high is None:
        raise ValueError("give the job's size: -np N, or --min_nodes and --max_nodes")
    try:
        return NodeBounds(low, high)
    except ValueError:
        raise ValueError(f"need 1 <= --min_nodes <= --max_nodes, got {low} and {high}") from None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    script = list(args.command)
    if script and script[0] == "--":
        script = script[1:]
    if script and _PYTHON.match(os.path.basename(script[0])):
        script = script[1:]  # agents run Python scripts with their own interpreter
    if not script:
        _die("give the training script to run, e.g. tensorflowrun ... python train.py")
    if not args.discovery and not args.hostfile:
        _die("give --discovery SCRIPT or --hostfile FILE (or both) to say which hosts to use")
    try:
        bounds = job_bounds(args)
    except ValueError as e:
        _die(str(e))
    args.min_nodes, args.max_nodes = bounds.min_nodes, bounds.max_nodes
    if args.discovery and not os.access(args.discovery, os.X_OK):
        _die(f"discovery script {args.discovery} is missing or not executable (chmod +x it)")
    if args.hostfile:
        try:
            hosts_lib.read_hostfile(args.hostfile)
        except (OSError, ValueError) as e:
            _die(str(e))
    for flag in ("discovery_interval", "cooldown", "max_cooldown", "idle_timeout", "stop_timeout"):
        if getattr(args, flag) <= 0:
            _die(f"--{flag} must be > 0")
    events_file = args.events_file or environment.text(environment.EVENTS_FILE)
    if events_file:
        args.events_file = os.path.abspath(events_file)
    try:
        token = auth.load_token(args.token_file)
        args.tls_cert, args.tls_key = embedded.tls_files(args.tls_cert, args.tls_key)
        args.token_file = args.token_file and os.path.abspath(args.token_file)
        server = embedded.serve(args.rdzv_endpoint, token, args.tls_cert, args.tls_key,
                                args.insecure, args.events_file,
                                # Its hosts' agents come and go (a failing host leaves and is
                                # started again after its cool-down): an ended run takes them
                                # back; tensorflowrun itself decides when the job is over.
                                one_job=False,
                                metrics_port=args.metrics_port, metrics_host=args.metrics_host)
    except (OSError, ValueError) as e:
        _die(str(e))
    supervisor = Supervisor(args, server.endpoint, script, token)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: supervisor.request_stop(signum))
    try:
        return supervisor.run()
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
