"""Supervision of the parameter-server mode: no orchestrator, each process restarts alone.

Workers of the asynchronous mode register with the PS themselves, so the
agent only hands each process its role and the PS address, and restarts a
dead one. A restarted PS serves at the same address and resumes from its
checkpoint; the workers reconnect to it by themselves.
"""

from __future__ import annotations

import socket

from tensorflow_elastic import environment
from tensorflow_elastic.launch.spec import WorkerSpec


class ParameterServerRoles:
    restarts_on_membership_change = False

    def __init__(self, spec: WorkerSpec, role: str, ps_address: str,
                 checkpoint_dir: str | None = None):
        self.spec = spec
        self.role = role
        self.ps_address = ps_address
        self.checkpoint_dir = checkpoint_dir

    def rendezvous(self) -> None:
        """Workers register with the PS when they start."""

    def refresh(self) -> None:
        """The PS keeps the membership; the agent only watches its processes."""

    def membership_changed(self) -> bool:
        return False

    def node_id(self, slot: int) -> int | None:
        return None

    def node_ids(self) -> list[int | None]:
        return [None] * self.spec.nproc_per_node

    def generation(self) -> int:
        return 0

    def world_size(self) -> int:
        return self.spec.nproc_per_node

    def worker_env(self, slot: int) -> dict[str, str]:
        env = {environment.PS_ROLE: self.role, environment.PS_ADDRESS: self.ps_address,
               environment.RUN_ID: self.spec.run_id}
        if self.checkpoint_dir:
            env[environment.PS_CHECKPOINT_DIR] = self.checkpoint_dir
        if self.spec.token:
            env[environment.TOKEN] = self.spec.token
        if self.spec.tls_ca:
            env[environment.TLS_CA] = self.spec.tls_ca
        return env

    def inherited_sockets(self, slot: int) -> list[socket.socket]:
        """The PS address is the user's: nothing is held for it."""
        return []

    def new_address(self, slot: int) -> None:
        """A restarted PS must come back where the workers look for it."""

    def exit_barrier(self) -> None:
        """The PS ends the job; there is nothing to wait for."""

    def report_death(self, slot: int, cause: str) -> None:
        """The PS finds a dead worker by its lease; there is no orchestrator to tell."""

    def leave(self, reason: str) -> None:
        """Workers leave the PS themselves (SIGTERM: push the gradient in flight, then leave)."""

    def close(self) -> None:
        """Nothing held."""
