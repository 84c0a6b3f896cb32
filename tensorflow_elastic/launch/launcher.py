"""``tfelastic-run`` (``python -m tensorflow_elastic.distributed.launch``): one node's launcher.

It checks the arguments, reaches (or with ``--standalone`` embeds) the
orchestrator, and hands the node's worker group to a
:class:`~tensorflow_elastic.launch.LocalAgent`, which runs it to the end.
Every bad argument ends here with one line that says what to change and
exit code 2, before anything starts.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
from typing import NoReturn

from tensorflow_elastic import __version__, environment, net
from tensorflow_elastic.launch import IN_PROCESS, WorkerSpec, embedded, gpus, slurm
from tensorflow_elastic.launch.flags import LauncherArgumentParser
from tensorflow_elastic.launch.in_process import InProcessElasticity
from tensorflow_elastic.launch.ports import PortAllocator
from tensorflow_elastic.launch.ps_roles import run_role
from tensorflow_elastic.launch.restart import RestartElasticity
from tensorflow_elastic.launch.spec import (AUTO, RESTART, default_log_dir, module_source,
                                           parse_nnodes)
from tensorflow_elastic.launch.supervise import on_stop_signals, supervise
from tensorflow_elastic.launch.worker_metrics import WorkerMetrics
from tensorflow_elastic.observability import prometheus
from tensorflow_elastic.ps.roles import PS, ROLES, WORKER
from tensorflow_elastic.rendezvous import Client, Orchestrator, RendezvousError, auth
from tensorflow_elastic.rendezvous.client import split_endpoints
from tensorflow_elastic.rendezvous.errors import UNKNOWN_RUN
from tensorflow_elastic.rendezvous.types import NodeBounds

PROG = "tfelastic-run"
ORCHESTRATOR_ONLY = "start"
COLLECTIVE = "collective"
DEFAULT_ENDPOINT = "127.0.0.1:29400"

_DESCRIPTION = """\
Runs one node of an elastic TensorFlow job: starts --nproc_per_node worker
processes of SCRIPT, keeps them alive (restarting a crashed one up to
--max_restarts times), and follows the job's membership through the
orchestrator at --rdzv_endpoint.

Two kinds of scripts:
  * elastic-aware (calls tensorflow_elastic.init() and uses
    ElasticMultiWorkerMirroredStrategy): nodes come and go inside the running
    workers; nothing restarts.
  * plain MultiWorkerMirroredStrategy (reads TF_CONFIG): on every membership
    change every worker restarts with a new TF_CONFIG and resumes from its
    BackupAndRestore or checkpoint.
The kind is detected from the script's source (see --elastic_mode).

With --role ps or --role worker the script runs in the asynchronous
parameter-server mode instead (tensorflow_elastic.ps.run): no orchestrator,
the PS at --ps_address holds the membership, and each process restarts alone.
"""

_EPILOG = """\
examples:
  # everything on this machine: an embedded orchestrator and 3 workers that go on with 2
  tfelastic-run --standalone --nproc_per_node 3 --nworkers 2:3 train.py

  # an orchestrator alone, then one launcher per machine: 2 to 3 machines, 4 workers each
  tfelastic-run --standalone --rdzv_endpoint=0.0.0.0:5555 --token_file tok start
  tfelastic-run --monitor_interval=5 --address=$(hostname -i):5556 --nnodes=2:3 \\
      --nproc_per_node=4 --rdzv_endpoint=$ORCHESTRATOR_HOST:5555 --token_file tok train.py

  # asynchronous parameter-server mode: one PS, then workers (here or elsewhere)
  tfelastic-run --role ps --ps_address 127.0.0.1:7070 --ps_checkpoint_dir ckpt train.py
  tfelastic-run --role worker --ps_address 127.0.0.1:7070 --nproc_per_node 3 train.py

As in torchrun, --nnodes counts nodes (launchers, one per machine), each with
--nproc_per_node workers: the job has MIN*N to MAX*N worker processes, and a
machine's loss takes all of its workers. Each worker is one member of the
orchestrator (its "node id" prefixes its output lines); --nworkers sets the
worker bounds directly, e.g. for one machine whose job may go on with fewer
workers, or machines with different numbers of workers.
A failed run prints a root-cause summary (first failure, its traceback).
Every multi-word flag takes both spellings, as in torchrun: --nproc-per-node
or --nproc_per_node.

A crash is restarted (up to --max_restarts); a user error is not: when every
worker of the node (two or more) fails the same way before the job's first
step, or a restarted worker fails exactly as before, the job ends at once with
that error (see docs/launcher.md).

exit codes:
  0        the job completed (or, stopped by a signal, every worker had ended cleanly)
  1        the job failed: workers failed after --max_restarts restarts, or the
           orchestrator was unreachable or failed the run
  2        a bad argument; nothing was started
  N        the workers' own exit code, when they failed the same way before their
           first step (or the same failure repeated): a user error, not restarted
  128+S    stopped by signal S (130: Ctrl-C, 143: SIGTERM) while workers ran

Failures are detected within: a crashed worker, at once (its agent reports
it); a host that vanishes (power loss, partition) or a frozen process, the
orchestrator's --heartbeat_timeout (1.5 s; workers heartbeat every 0.25 s,
$TFE_HEARTBEAT_INTERVAL); a worker stuck in Python, $TFE_PROGRESS_TIMEOUT
(300 s) without a commit, then the heartbeat timeout; one stuck inside
TensorFlow, twice that, then $TFE_BARRIER_TIMEOUT (30 s). A removed worker
whose process lives on rejoins in place when it is reachable again. See
docs/failures.md.
"""


def build_parser() -> argparse.ArgumentParser:
    p = LauncherArgumentParser(prog=PROG, description=_DESCRIPTION, epilog=_EPILOG,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("--standalone", action="store_true",
                   help="embed the orchestrator in this launcher (at --rdzv_endpoint, default: a "
                   "free port on 127.0.0.1); with the script 'start' run only the orchestrator")
    p.add_argument("--slurm", action="store_true",
                   help="started by srun, one launcher per node (no ssh): the job's launchers "
                   "are $SLURM_NTASKS (the default of --nnodes), task 0 ($SLURM_PROCID) embeds "
                   "the orchestrator on the first host of $SLURM_JOB_NODELIST at port "
                   f"{slurm.DEFAULT_PORT} (--rdzv_endpoint :PORT for another) and the others "
                   "reach it there")
    p.add_argument("--rdzv_endpoint", metavar="HOST:PORT[,HOST:PORT]",
                   help=f"the orchestrator, or every replica of it (tfelastic-orchestrator "
                   f"--store etcd://...): calls go to the one that leads (default: "
                   f"{DEFAULT_ENDPOINT}; with --standalone the address to serve at)")
    p.add_argument("--nnodes", metavar="MIN:MAX",
                   help="nodes (launchers, usually machines) in the job: N, or MIN:MAX to start "
                   "at MIN and grow to MAX; the job has MIN*N to MAX*N workers with N "
                   "--nproc_per_node (default: 1; with --slurm, $SLURM_NTASKS)")
    p.add_argument("--nproc_per_node", type=int, default=1, metavar="N",
                   help="worker processes this launcher runs (default: %(default)s)")
    p.add_argument("--gpus", choices=gpus.PLACEMENTS, default=gpus.SPLIT,
                   help="on a machine with GPUs, split: each of the --nproc_per_node workers "
                   "sees its share of them (one each when they are as many) through "
                   "CUDA_VISIBLE_DEVICES; all: every worker sees every GPU (with "
                   "--nproc_per_node 1, one worker drives them all, one replica per GPU) "
                   "(default: %(default)s)")
    p.add_argument("--nworkers", metavar="MIN:MAX",
                   help="worker processes in the whole job, in place of --nnodes x "
                   "--nproc_per_node (every launcher of the job gives the same)")
    p.add_argument("--monitor_interval", type=float, default=1.0, metavar="S",
                   help="seconds between checks of the workers (default: %(default)s)")
    p.add_argument("--address", metavar="HOST[:PORT]",
                   help="where other nodes reach this node's workers; PORT is the first worker's "
                   "TensorFlow port, others get free ports (default: the address on the route to "
                   "the orchestrator, free ports)")
    p.add_argument("--max_restarts", type=int, default=3, metavar="N",
                   help="worker restarts after crashes before this node gives up "
                   "(default: %(default)s)")
    p.add_argument("--spares", type=int, default=0, metavar="N",
                   help="keep N warm spare workers once the job runs (elastic-aware scripts): "
                   "each imports, builds and warms up its step, then waits, not a member, until "
                   "a worker of this node dies; it then joins in its place at once (counted as a "
                   "restart) and a new spare starts (default: %(default)s)")
    p.add_argument("--fork_server", action="store_true",
                   help="fork every worker (the first ones, replacements, spares) from a "
                   "process that imported TensorFlow and tensorflow_elastic once, so a worker "
                   "starts without their import; Python scripts only (default: off)")
    p.add_argument("--run_id", default="default", metavar="ID",
                   help="the job's name on the orchestrator; every node of a job uses the same "
                   "(default: %(default)s)")
    p.add_argument("--events_file", metavar="PATH",
                   help=f"append the job's events (JSON lines) here; workers get it too "
                   f"(default: ${environment.EVENTS_FILE} if set)")
    p.add_argument("--elastic_mode", choices=[AUTO, IN_PROCESS, RESTART], default=AUTO,
                   help="in_process for elastic-aware scripts, restart for plain MWMS scripts; "
                   "auto picks by looking for tensorflow_elastic's API in the script "
                   "(default: %(default)s)")
    p.add_argument("--token_file", help=f"file with the orchestrator's shared token "
                   f"(default: ${environment.TOKEN} if set)")
    p.add_argument("--tls_ca", metavar="PEM",
                   help="certificate to trust when the orchestrator uses TLS; the agent and its "
                   f"workers connect with TLS (default: ${environment.TLS_CA} if set; with "
                   "--standalone and --tls_cert, that certificate)")
    p.add_argument("--tls_cert", metavar="PEM",
                   help="with --standalone: the embedded orchestrator serves TLS with this "
                   "certificate chain (needs --tls_key)")
    p.add_argument("--tls_key", metavar="PEM", help="the private key of --tls_cert")
    p.add_argument("--insecure", action="store_true",
                   help="with --standalone (or --role ps): allow a non-loopback --rdzv_endpoint "
                   "(--ps_address) without a token")
    p.add_argument("--log_dir", help="where each worker's full output (output.log) and error file "
                   "go (default: a new temporary directory)")
    p.add_argument("--verbose", action="store_true",
                   help="show TensorFlow's own log lines on the console too (by default they go "
                   "only to each worker's output.log: a recovery's aborted collectives log about "
                   "30 of them per worker)")
    p.add_argument("--rdzv_timeout", type=float, default=30.0, metavar="S",
                   help="seconds to wait for the orchestrator to answer before giving up "
                   "(default: %(default)s)")
    p.add_argument("--join_timeout", type=float, default=600.0, metavar="S",
                   help="seconds to wait for enough nodes to form the job (default: %(default)s)")
    p.add_argument("--stop_timeout", type=float, default=30.0, metavar="S",
                   help="seconds a worker gets to stop after SIGTERM before SIGKILL "
                   "(default: %(default)s)")
    p.add_argument("--exit_barrier_timeout", type=float, default=300.0, metavar="S",
                   help="seconds to wait at the end for the other nodes to finish "
                   "(default: %(default)s)")
    p.add_argument("--progress_interval", type=float, default=30.0, metavar="S",
                   help="seconds between progress lines (step, world size, steps/s), from what "
                   "the workers report (and the events file); 0: none (default: %(default)s)")
    prometheus.add_flags(p, "this node's workers: step, steps/s, generation, world size, "
                         "recoveries and their durations, lost steps, sync bytes; with "
                         "--standalone also the orchestrator's")
    p.add_argument("--role", choices=[COLLECTIVE, *ROLES], default=COLLECTIVE,
                   help="collective: synchronous data-parallel workers (MWMS); ps / worker: the "
                   "asynchronous parameter-server mode, this launcher runs the PS or "
                   "--nproc_per_node workers of it (default: %(default)s)")
    p.add_argument("--ps_address", metavar="HOST:PORT",
                   help="with --role ps|worker: where the parameter server listens")
    p.add_argument("--ps_checkpoint_dir", metavar="DIR",
                   help="with --role ps: where the PS checkpoints and, after a restart, resumes")
    p.add_argument("-m", "--module", action="store_true",
                   help="SCRIPT is a Python module, run as `python -m SCRIPT` (as torchrun -m)")
    p.add_argument("--no_python", action="store_true",
                   help="run SCRIPT as an executable even if it ends in .py, without the Python "
                   "interpreter (as torchrun --no-python)")
    p.add_argument("script", metavar="SCRIPT",
                   help="the training script (a .py file, or an executable; a module with -m), "
                   "or 'start' with --standalone to run only the orchestrator")
    p.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS",
                   help="arguments for the script")
    return p


def _die(message: str, code: int = 2) -> NoReturn:
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def _check_role_args(args: argparse.Namespace) -> None:
    if args.role == COLLECTIVE:
        for flag in ("ps_address", "ps_checkpoint_dir"):
            if getattr(args, flag):
                _die(f"--{flag} belongs to the parameter-server mode; add --role ps or "
                     f"--role worker")
        return
    if not args.ps_address:
        _die(f"--role {args.role} needs --ps_address HOST:PORT (where the PS listens)")
    try:
        host, _ = net.parse_address(args.ps_address, allow_port_zero=True)
        token = auth.load_token(args.token_file)
    except (OSError, ValueError) as e:
        _die(f"--ps_address: {e}" if isinstance(e, net.AddressError) else str(e))
    refusal = auth.exposure_error(host, token, args.insecure) if args.role == PS else None
    if refusal:
        _die(f"--role ps: {refusal}")
    if args.role == PS and args.nproc_per_node != 1:
        _die("--role ps runs one parameter server process; drop --nproc_per_node")
    if args.role == WORKER and args.ps_checkpoint_dir:
        _die("--ps_checkpoint_dir is for --role ps (the PS checkpoints, workers do not)")
    if args.standalone or args.script == ORCHESTRATOR_ONLY:
        _die(f"--role {args.role} needs no orchestrator; drop --standalone / '{ORCHESTRATOR_ONLY}'")


def _check_tls_args(args: argparse.Namespace) -> None:
    try:
        args.tls_cert, args.tls_key = embedded.tls_files(args.tls_cert, args.tls_key)
    except ValueError as e:
        _die(str(e))
    if args.tls_cert and not (args.standalone or args.slurm):
        _die("--tls_cert/--tls_key are for the orchestrator --standalone embeds; to reach a "
             "TLS orchestrator give --tls_ca")
    if args.insecure and not (args.standalone or args.slurm) and args.role != PS:
        _die("--insecure is for what this launcher serves (--standalone, --role ps); "
             "tfelastic-orchestrator has its own")
    args.tls_ca = args.tls_ca or environment.text(environment.TLS_CA) or args.tls_cert
    if args.tls_ca and not os.path.isfile(args.tls_ca):
        _die(f"--tls_ca {args.tls_ca}: no such file")
    args.tls_ca = args.tls_ca and os.path.abspath(args.tls_ca)


def _place_in_slurm(args: argparse.Namespace) -> None:
    """With --slurm: the orchestrator's address and the job's launchers from srun's variables;
    task 0 embeds the orchestrator."""
    if args.standalone:
        _die("--slurm and --standalone: give one (with --slurm, task 0 embeds the orchestrator)")
    if args.role != COLLECTIVE:
        _die(f"--slurm starts collective workers; drop --role {args.role}")
    try:
        task = slurm.task_from_environment(os.environ)
    except ValueError as e:
        _die(f"--slurm: {e}")
    given = args.rdzv_endpoint or f":{slurm.DEFAULT_PORT}"
    if not (given.startswith(":") and given[1:].isdigit()):
        _die("--slurm serves the orchestrator on the first host of the allocation: "
             "--rdzv_endpoint takes only its port, as :PORT")
    args.rdzv_endpoint = net.format_address(task.orchestrator_host, int(given[1:]))
    args.nnodes = args.nnodes or str(task.ntasks)
    args.standalone = task.serves_orchestrator


def _check_args(args: argparse.Namespace) -> tuple[int, int]:
    if args.slurm:
        _place_in_slurm(args)
    args.nnodes = args.nnodes or "1"
    _check_role_args(args)
    _check_tls_args(args)
    if args.nproc_per_node < 1:
        _die(f"--nproc_per_node must be >= 1, got {args.nproc_per_node}")
    if args.role != COLLECTIVE:
        args.nworkers = str(args.nproc_per_node)
    try:
        if args.nworkers:
            bounds = parse_nnodes(args.nworkers, "--nworkers")
        else:
            per_launcher = parse_nnodes(args.nnodes)
            bounds = NodeBounds(per_launcher.min_nodes * args.nproc_per_node,
                                per_launcher.max_nodes * args.nproc_per_node)
        if args.rdzv_endpoint:
            replicas = split_endpoints(args.rdzv_endpoint)
            if args.standalone and len(replicas) > 1:
                raise ValueError("--standalone serves one orchestrator: give --rdzv_endpoint a "
                                 "single HOST:PORT (replicas run as tfelastic-orchestrator "
                                 "--store etcd://...)")
            for replica in replicas:
                net.parse_address(replica, allow_port_zero=True)
        if args.address:
            _parse_address(args.address)
    except ValueError as e:
        _die(str(e))
    for flag in ("monitor_interval", "rdzv_timeout", "join_timeout", "stop_timeout",
                 "exit_barrier_timeout"):
        if getattr(args, flag) <= 0:
            _die(f"--{flag} must be > 0, got {getattr(args, flag)}")
    if args.progress_interval < 0:
        _die(f"--progress_interval must be >= 0 (0: no progress lines), got "
             f"{args.progress_interval}")
    if args.metrics_port is not None and args.role != COLLECTIVE:
        _die(f"--metrics_port serves the metrics of collective workers; drop it with "
             f"--role {args.role}")
    if args.nproc_per_node > bounds.max_nodes:
        _die(f"--nproc_per_node={args.nproc_per_node} is more than the --nworkers maximum "
             f"{bounds.max_nodes}; raise --nworkers")
    if args.max_restarts < 0:
        _die(f"--max_restarts must be >= 0, got {args.max_restarts}")
    _check_spares(args)
    if args.module and args.no_python:
        _die("-m runs a Python module; --no-python runs an executable: give one of them")
    if args.fork_server and args.no_python:
        _die("--fork_server forks Python workers from a preloaded interpreter; an executable "
             "(--no-python) cannot be: drop one of them")
    if args.script == ORCHESTRATOR_ONLY and not args.module:
        if not args.standalone:
            _die(f"'{ORCHESTRATOR_ONLY}' runs only an orchestrator and needs --standalone")
    elif args.module:
        if module_source(args.script) is None:
            _die(f"module {args.script!r} not found (cwd {os.getcwd()}); -m takes a module "
                 f"name importable from here, e.g. mypackage.train")
    elif args.no_python:
        if shutil.which(args.script) is None:
            _die(f"--no-python: {args.script!r} is not an executable (cwd {os.getcwd()}); "
                 f"chmod +x it or drop --no-python")
    elif not os.path.isfile(args.script) and shutil.which(args.script) is None:
        _die(f"script {args.script!r} not found (cwd {os.getcwd()}); give a path to a .py file "
             f"or an executable")
    return bounds


def _check_spares(args: argparse.Namespace) -> None:
    if not args.spares:
        return
    if args.spares < 0:
        _die(f"--spares must be >= 0, got {args.spares}")
    if args.role != COLLECTIVE or args.elastic_mode == RESTART:
        _die("--spares keeps warm workers of an elastic-aware script (in-process elasticity); "
             "drop it with --role ps|worker or --elastic_mode restart")
    if args.gpus == gpus.SPLIT and args.nproc_per_node > 1 and gpus.visible_gpus():
        _die("--spares with --gpus split: a spare cannot know ahead whose GPUs it takes; use "
             "--gpus all, or one worker per launcher")


def _parse_address(value: str) -> tuple[str, int]:
    if value.count(":") == 0 or (value.startswith("[") and value.endswith("]")):
        return value.strip("[]"), 0
    return net.parse_address(value, allow_port_zero=True)


def _check_reachable(endpoint: str, run_id: str, token: str | None, tls_ca: str | None,
                     timeout: float) -> None:
    with Client(endpoint, run_id, token, tls_ca=tls_ca, retry_timeout=timeout,
                call_timeout=min(10.0, timeout)) as client:
        try:
            client.status()
        except RendezvousError as e:
            if e.reason == UNKNOWN_RUN:
                return  # reachable; this node will be the run's first
            _die(f"cannot reach the orchestrator at {endpoint} ({e.code.name}: "
                 f"{e.message.splitlines()[0]}); start one (tfelastic-orchestrator, or "
                 f"{PROG} --standalone --rdzv_endpoint {endpoint} {ORCHESTRATOR_ONLY}) or fix "
                 f"--rdzv_endpoint", code=1)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    bounds = _check_args(args)
    try:
        token = auth.load_token(args.token_file)
    except (OSError, ValueError) as e:
        _die(str(e))
    events_file = args.events_file or environment.text(environment.EVENTS_FILE)
    if events_file:
        events_file = os.path.abspath(events_file)

    if args.role != COLLECTIVE:
        spec = _worker_spec(args, "", token, events_file, bounds)
        return run_role(spec, args.role, args.ps_address, args.ps_checkpoint_dir)
    server = None
    endpoint = args.rdzv_endpoint or DEFAULT_ENDPOINT
    if args.standalone:
        try:
            server = embedded.serve(args.rdzv_endpoint or "127.0.0.1:0", token, args.tls_cert,
                                    args.tls_key, args.insecure, events_file,
                                    one_job=args.script != ORCHESTRATOR_ONLY)
        except ValueError as e:
            _die(f"--standalone: {e}")
        except OSError as e:
            _die(str(e), code=1)
        endpoint = server.endpoint
    metrics, metrics_endpoint = _serve_metrics(args, server)
    try:
        if args.script == ORCHESTRATOR_ONLY:
            stop = threading.Event()
            on_stop_signals(lambda signum: stop.set())
            while not stop.wait(1.0) and server.running:
                pass
            return 0
        _check_reachable(endpoint, args.run_id, token, args.tls_ca, args.rdzv_timeout)
        return _run_collective(args, endpoint, token, events_file, bounds,
                               hosts_orchestrator=server is not None, metrics=metrics)
    finally:
        if metrics_endpoint is not None:
            metrics_endpoint.close()
        if server is not None:
            server.stop()


def _serve_metrics(args: argparse.Namespace, server: Orchestrator | None
                   ) -> tuple[WorkerMetrics | None, prometheus.Endpoint | None]:
    """With --metrics_port: the workers' metrics (and the embedded orchestrator's) served."""
    if args.metrics_port is None:
        return None, None
    metrics = WorkerMetrics(args.run_id)
    registries = [metrics.registry] + ([server.metrics_registry] if server is not None else [])
    endpoint = prometheus.Endpoint(*registries)
    try:
        port = endpoint.serve(args.metrics_host, args.metrics_port)
    except OSError as e:
        if server is not None:
            server.stop()
        _die(f"cannot serve metrics at --metrics_host {args.metrics_host} --metrics_port "
             f"{args.metrics_port}: {e}", code=1)
    print(f"[agent] metrics on {prometheus.url(args.metrics_host, port)}", file=sys.stderr,
          flush=True)
    return metrics, endpoint


def _collective_mode(spec: WorkerSpec, ports: PortAllocator, wake: threading.Event,
                     hosts_orchestrator: bool
                     ) -> tuple[InProcessElasticity | RestartElasticity, str]:
    """How this node's workers follow the job's membership, and a line that says so."""
    mode, why = spec.resolved_mode()
    text = f"{mode.replace('_', '-')} elasticity: {why}"
    if mode == IN_PROCESS:
        return InProcessElasticity(spec, ports, hosts_orchestrator), text
    if spec.spares:
        _die(f"--spares needs an elastic-aware script: {why}")
    addresses = [ports.address() for _ in range(spec.nproc_per_node)]
    return RestartElasticity(spec, addresses, wake), text


def _run_collective(args: argparse.Namespace, endpoint: str, token: str | None,
                    events_file: str | None, bounds: NodeBounds,
                    hosts_orchestrator: bool, metrics: WorkerMetrics | None = None) -> int:
    if args.address:
        host, first_port = _parse_address(args.address)
    else:
        endpoint_host = net.parse_address(split_endpoints(endpoint)[0], allow_port_zero=True)[0]
        host, first_port = net.local_address_towards(endpoint_host), 0
    spec = _worker_spec(args, endpoint, token, events_file, bounds, host,
                        first_port)
    wake = threading.Event()
    mode, why = _collective_mode(spec, PortAllocator(host, first_port), wake, hosts_orchestrator)
    return supervise(spec, mode, wake, why, membership=mode, metrics=metrics)


def _worker_spec(args: argparse.Namespace, endpoint: str, token: str | None,
                 events_file: str | None, bounds: NodeBounds,
                 host: str = "127.0.0.1", first_port: int = 0) -> WorkerSpec:
    return WorkerSpec(
        entrypoint=args.script, args=args.script_args, module=args.module,
        no_python=args.no_python, rdzv_endpoint=endpoint, run_id=args.run_id,
        bounds=bounds, nproc_per_node=args.nproc_per_node, host=host,
        first_port=first_port, max_restarts=args.max_restarts,
        monitor_interval=args.monitor_interval, mode=args.elastic_mode, token=token,
        tls_ca=args.tls_ca,
        events_file=events_file, log_dir=args.log_dir or default_log_dir(args.run_id),
        stop_timeout=args.stop_timeout, join_timeout=args.join_timeout,
        exit_barrier_timeout=args.exit_barrier_timeout, progress_interval=args.progress_interval,
        verbose=args.verbose, gpus=args.gpus, spares=args.spares, fork_server=args.fork_server)


if __name__ == "__main__":
    sys.exit(main())
