"""The local agent: starts, monitors and restarts one node's worker processes.

``record`` is for scripts started without the agent's bootstrap (e.g. by
another launcher) that still want an error file for the failure summary.
"""

from tensorflow_elastic.agent.agent import LocalAgent, RunResult
from tensorflow_elastic.agent.errors import WorkerFailure, record
from tensorflow_elastic.agent.spec import IN_PROCESS, RESTART, WorkerSpec, WorkerState

__all__ = ["IN_PROCESS", "RESTART", "LocalAgent", "RunResult", "WorkerFailure", "WorkerSpec",
           "WorkerState", "record"]
