"""Supervision: `tfelastic-run` and `tensorflowrun` (their flags in torchrun's and horovodrun's
spellings), the local agent that starts, monitors and restarts a node's workers (doing what a
pure decision says; a failure a restart would repeat ends the job), its modes (in-process,
restart, PS roles), error files, the workers' Prometheus metrics, and a launcher's place in a
Slurm job started by srun.
"""

from tensorflow_elastic.launch.agent import AgentResult, LocalAgent
from tensorflow_elastic.launch.error_files import WorkerFailure, record
from tensorflow_elastic.launch.spec import IN_PROCESS, RESTART, WorkerSpec, WorkerState

__all__ = ["IN_PROCESS", "RESTART", "AgentResult", "LocalAgent", "WorkerFailure", "WorkerSpec",
           "WorkerState", "record"]
