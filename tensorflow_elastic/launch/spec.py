"""What an agent runs (the worker group spec) and the states it moves through."""

from __future__ import annotations

import dataclasses
import enum
import importlib.machinery
import os
import re
import sys
import tempfile

from tensorflow_elastic.launch import gpus as gpus_lib
from tensorflow_elastic.rendezvous.client import Client
from tensorflow_elastic.rendezvous.types import NodeBounds

IN_PROCESS = "in_process"
RESTART = "restart"
AUTO = "auto"

# Names an elastic-aware script uses; a script without them is plain MWMS code.
_ELASTIC_API = re.compile(r"ElasticMultiWorkerMirroredStrategy|tensorflow_elastic\.init\b"
                          r"|\btfe\.init\b|tensorflow_elastic\.run\b|\btfe\.run\b")


class WorkerState(enum.Enum):
    """The agent's view of its worker group.

    INIT: rendezvous and first start. HEALTHY: every worker runs (or some have
    finished). UNHEALTHY: a worker failed and the agent is deciding or
    restarting. SUCCEEDED / FAILED: final. STOPPED: a signal ended the group.
    """

    INIT = "INIT"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"


@dataclasses.dataclass
class WorkerSpec:
    """Everything an agent needs to start and restart its workers.

    ``entrypoint`` is a script (a .py file runs with this Python, anything else as an
    executable), a module's name with ``module`` (``python -m``), or an executable
    whatever its name with ``no_python``. ``bounds`` count orchestrator nodes, i.e. worker processes across every
    agent of the run (checked where they were parsed: NodeBounds). ``host`` is the address the
    workers' TensorFlow servers are reached at; ``first_port`` (0: any) is the
    first worker's port, later workers and restarted ones take free ports. ``gpus``: how the
    machine's GPUs are shared among the workers (launch/gpus.py).
    """

    entrypoint: str
    args: list[str]
    rdzv_endpoint: str
    run_id: str
    bounds: NodeBounds
    module: bool = False
    no_python: bool = False
    nproc_per_node: int = 1
    host: str = "127.0.0.1"
    first_port: int = 0
    max_restarts: int = 3
    monitor_interval: float = 1.0
    mode: str = AUTO
    token: str | None = None
    tls_ca: str | None = None
    events_file: str | None = None
    log_dir: str | None = None
    stop_timeout: float = 30.0
    join_timeout: float = 600.0
    exit_barrier_timeout: float = 300.0
    progress_interval: float = 30.0
    verbose: bool = False
    gpus: str = gpus_lib.SPLIT
    spares: int = 0  # warm spare workers kept once the job runs (launch/spares.py)
    fork_server: bool = False  # workers forked from a preloaded process (launch/fork_server.py)

    def __post_init__(self) -> None:
        if self.nproc_per_node < 1:
            raise ValueError(f"nproc_per_node must be >= 1, got {self.nproc_per_node}")
        if self.nproc_per_node > self.bounds.max_nodes:
            raise ValueError(f"nproc_per_node={self.nproc_per_node} workers would exceed "
                             f"max_nodes={self.bounds.max_nodes} worker processes; raise "
                             f"--nworkers")
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")
        if self.spares < 0:
            raise ValueError(f"spares must be >= 0, got {self.spares}")
        if self.monitor_interval <= 0:
            raise ValueError(f"monitor_interval must be > 0, got {self.monitor_interval}")
        if self.module and self.no_python:
            raise ValueError("a module runs with Python: module and no_python exclude each other")
        if self.gpus not in gpus_lib.PLACEMENTS:
            raise ValueError(f"gpus must be one of {gpus_lib.PLACEMENTS}, got {self.gpus!r}")
        if self.mode not in (AUTO, IN_PROCESS, RESTART):
            raise ValueError(f"mode must be {AUTO}, {IN_PROCESS} or {RESTART}, got {self.mode!r}")

    def orchestrator_client(self, **options) -> Client:
        """A client of the job's orchestrator with this node's token and TLS trust."""
        return Client(self.rdzv_endpoint, self.run_id, self.token, tls_ca=self.tls_ca, **options)

    @property
    def is_python(self) -> bool:
        return self.module or (not self.no_python and self.entrypoint.endswith(".py"))

    def command(self) -> list[str]:
        """Python code runs through the bootstrap (error files); anything else runs as is."""
        if not self.is_python:
            return [self.entrypoint, *self.args]
        bootstrap = [sys.executable, "-u", "-m", "tensorflow_elastic.launch.bootstrap"]
        if self.module:
            return [*bootstrap, "-m", self.entrypoint, *self.args]
        return [*bootstrap, self.entrypoint, *self.args]

    def source_file(self) -> str | None:
        """The Python file that runs first (a module's, found without importing it)."""
        if not self.is_python:
            return None
        return module_source(self.entrypoint) if self.module else self.entrypoint

    def resolved_mode(self) -> tuple[str, str]:
        """(mode, why): in-process for scripts that use the elastic API, restart-based otherwise."""
        if self.mode != AUTO:
            return self.mode, "chosen with --elastic_mode"
        path = self.source_file()
        if path is None:
            return RESTART, "the entrypoint is not a Python script"
        with open(path, encoding="utf-8", errors="replace") as f:
            source = f.read()
        if _ELASTIC_API.search(source):
            return IN_PROCESS, "the script uses tensorflow_elastic's elastic API"
        return RESTART, ("the script does not call tensorflow_elastic.init(); it gets TF_CONFIG "
                         "and is restarted on every membership change")


def module_source(name: str, cwd: str | None = None) -> str | None:
    """The file ``python -m name`` would run from ``cwd``, found without importing anything
    (a package runs its ``__main__``); None if there is none."""
    search: list[str] | None = [cwd or os.getcwd(), *sys.path]
    spec = None
    for part in [*name.split("."), "__main__"]:
        if part == "__main__" and spec is not None and spec.submodule_search_locations is None:
            break
        if search is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(part, search)
        if spec is None:
            return None
        search = list(spec.submodule_search_locations or []) or None
    origin = getattr(spec, "origin", None)
    return origin if origin and origin.endswith(".py") and os.path.isfile(origin) else None


def parse_nnodes(value: str, flag: str = "--nnodes") -> NodeBounds:
    """'N' or 'MIN:MAX' -> the bounds, with a message that says what is wrong."""
    parts = value.split(":")
    try:
        if len(parts) == 1:
            low = high = int(parts[0])
        elif len(parts) == 2:
            low, high = int(parts[0]), int(parts[1])
        else:
            raise ValueError
    except ValueError:
        raise ValueError(f"{flag} must be N or MIN:MAX (e.g. 2:4), got {value!r}") from None
    try:
        return NodeBounds(low, high)
    except ValueError:
        raise ValueError(f"{flag} {value}: need 1 <= MIN <= MAX") from None


def default_log_dir(run_id: str) -> str:
    """A new directory for this launcher's error files."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)
    return tempfile.mkdtemp(prefix=f"tfelastic-{safe}-")


# A killed worker's memory is torn down before its sockets close and before its agent hears
# of the death: in 4 KiB pages that takes the kernel tens to hundreds of milliseconds at model
# sizes, in 2 MiB pages (glibc's malloc asking for transparent huge pages) a few. Peers and
# the orchestrator learn of the death that much sooner.
HUGE_PAGE_MALLOC = "glibc.malloc.hugetlb"


def malloc_tunables(current: str | None) -> str:
    """A worker's GLIBC_TUNABLES: ``current`` with malloc's huge pages on, unless ``current``
    already sets them (``glibc.malloc.hugetlb=0`` keeps them off)."""
    tunables = [t for t in (current or "").split(":") if t]
    if any(t.split("=", 1)[0] == HUGE_PAGE_MALLOC for t in tunables):
        return ":".join(tunables)
    return ":".join([*tunables, f"{HUGE_PAGE_MALLOC}=1"])


def worker_env(extra: dict[str, str]) -> dict[str, str]:
    """This process's environment plus ``extra``, with unbuffered Python output and malloc's
    huge pages (see HUGE_PAGE_MALLOC)."""
    env = dict(os.environ)
    env.update(extra)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env["GLIBC_TUNABLES"] = malloc_tunables(env.get("GLIBC_TUNABLES"))
    return env
