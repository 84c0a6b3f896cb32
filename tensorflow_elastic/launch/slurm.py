"""Where a launcher started by ``srun`` stands in its Slurm job: read from the SLURM_* variables.

``srun --ntasks-per-node=1 tfelastic-run --slurm ... train.py`` starts one
launcher per node without ssh (inside Slurm's cgroups). Every launcher finds
the orchestrator on the first host of the allocation; the launcher of task 0,
which runs there, serves it.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

NODELIST = "SLURM_JOB_NODELIST"
NODEID = "SLURM_NODEID"
NTASKS = "SLURM_NTASKS"
PROCID = "SLURM_PROCID"
DEFAULT_PORT = 29400


@dataclasses.dataclass(frozen=True)
class SlurmTask:
    """This launcher's task: the orchestrator's host, its rank, the launchers in the job."""

    orchestrator_host: str
    proc_id: int
    node_id: int
    ntasks: int

    @property
    def serves_orchestrator(self) -> bool:
        return self.proc_id == 0


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list: ``node[07-09,12],gpu1`` -> ``node07``."""
    host, depth, i = "", 0, 0
    while i < len(nodelist):
        char = nodelist[i]
        if char == "," and depth == 0:
            break
        if char == "[":
            end = nodelist.find("]", i)
            if end < 0:
                raise ValueError(f"${NODELIST}={nodelist!r}: an unclosed '['")
            first = nodelist[i + 1:end].split(",")[0].split("-")[0]
            if not first:
                raise ValueError(f"${NODELIST}={nodelist!r}: an empty range")
            host += first
            i = end + 1
            continue
        host += char
        i += 1
    if not host.strip():
        raise ValueError(f"${NODELIST}={nodelist!r} names no host")
    return host.strip()


def _missing(name: str) -> ValueError:
    return ValueError(f"${name} is not set: start tfelastic-run --slurm with srun inside an "
                      f"allocation (sbatch, salloc)")


def _count(env: Mapping[str, str], name: str, minimum: int) -> int:
    value = env.get(name)
    if value is None:
        raise _missing(name)
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"${name}={value!r} is not a whole number") from None
    if number < minimum:
        raise ValueError(f"${name} must be >= {minimum}, got {number}")
    return number


def task_from_environment(env: Mapping[str, str]) -> SlurmTask:
    """This task, from the variables srun sets; ValueError says which one is missing or wrong."""
    nodelist = env.get(NODELIST)
    if not nodelist:
        raise _missing(NODELIST)
    task = SlurmTask(first_host(nodelist), _count(env, PROCID, 0), _count(env, NODEID, 0),
                     _count(env, NTASKS, 1))
    if task.proc_id >= task.ntasks:
        raise ValueError(f"${PROCID}={task.proc_id} is not below ${NTASKS}={task.ntasks}")
    if task.serves_orchestrator and task.node_id != 0:
        raise ValueError(f"task 0 runs on node {task.node_id}, not on the first host "
                         f"{task.orchestrator_host} where the others look for the orchestrator")
    return task
