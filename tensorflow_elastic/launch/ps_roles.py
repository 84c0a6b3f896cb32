"""Supervision of the parameter-server mode: no orchestrator, each process restarts alone.

Workers of the asynchronous mode register with the PS themselves, so the
agent only hands each process its role and the PS address, and restarts a
dead one. A restarted PS serves at the same address and resumes from its
checkpoint; the workers reconnect to it by themselves. The PS finds a dead
worker by its lease and ends the job, so the agent has no membership to keep.
"""

from __future__ import annotations

import threading

from tensorflow_elastic import environment
from tensorflow_elastic.launch.decision import Scope
from tensorflow_elastic.launch.mode import WorkerLaunch
from tensorflow_elastic.launch.spec import WorkerSpec
from tensorflow_elastic.launch.supervise import supervise
from tensorflow_elastic.ps.roles import PS


class ParameterServerRoles:
    """The environment of a PS or worker process; a dead one comes back alone, unchanged.

    Its processes have no node id (they register with the PS, not an orchestrator): the
    agent's lines name them by role, and the PS's output lines say they come from the PS.
    """

    scope = Scope.WORKER

    def __init__(self, spec: WorkerSpec, role: str, ps_address: str,
                 checkpoint_dir: str | None = None):
        self.spec = spec
        self.role = role
        self.worker_name = "parameter server" if role == PS else "PS worker"
        self.output_label = PS if role == PS else None
        self.ps_address = ps_address
        self.checkpoint_dir = checkpoint_dir

    def launch(self, slot: int) -> WorkerLaunch:
        """The PS address is the user's: nothing is held for it, and a restarted PS comes back
        where the workers look for it."""
        env = {environment.PS_ROLE: self.role, environment.PS_ADDRESS: self.ps_address,
               environment.RUN_ID: self.spec.run_id}
        if self.checkpoint_dir:
            env[environment.PS_CHECKPOINT_DIR] = self.checkpoint_dir
        if self.spec.token:
            env[environment.TOKEN] = self.spec.token
        if self.spec.tls_ca:
            env[environment.TLS_CA] = self.spec.tls_ca
        return WorkerLaunch(env)


def run_role(spec: WorkerSpec, role: str, ps_address: str, checkpoint_dir: str | None) -> int:
    """Runs this node's PS or workers (``tfelastic-run --role``) to the end; the exit code."""
    return supervise(spec, ParameterServerRoles(spec, role, ps_address, checkpoint_dir),
                     threading.Event(),
                     f"parameter-server mode, role {role}: each process restarts alone")
