"""In-process elasticity: the workers are the orchestrator's nodes; the agent only keeps them alive.

A script that calls ``tensorflow_elastic.init()`` joins the orchestrator
itself (one node per process) and re-forms inside the running processes, so
the agent never restarts a worker for a membership change. It restarts a
worker only when the process died; the new process joins as a new node with
a new address. The agent learns each worker's node id from the
orchestrator's status (by the address it gave the worker), to prefix output
and name failures.
"""

from __future__ import annotations

import logging
import socket
import time

from tensorflow_elastic import environment
from tensorflow_elastic.launch.decision import Scope
from tensorflow_elastic.launch.mode import View, WorkerLaunch
from tensorflow_elastic.launch.ports import PortAllocator
from tensorflow_elastic.launch.spec import WorkerSpec
from tensorflow_elastic.rendezvous import Phase
from tensorflow_elastic.rendezvous.errors import UNKNOWN_RUN, RendezvousError

logger = logging.getLogger(__name__)

# A node silent this long has stopped heartbeating (workers beat every 0.5 s).
QUIET_S = 3.0


class InProcessElasticity:
    """Environment for elastic-aware workers, and the agent's read-only view of the run."""

    scope = Scope.WORKER

    def __init__(self, spec: WorkerSpec, ports: PortAllocator, hosts_orchestrator: bool = False):
        self.spec = spec
        self._ports = ports
        self._hosts_orchestrator = hosts_orchestrator
        self._addresses: list[str] = []
        self._held: dict[int, socket.socket] = {}
        for slot in range(spec.nproc_per_node):
            address, self._held[slot] = ports.held_address()
            self._addresses.append(address)
        self._node_ids: dict[str, int] = {}
        self._status_client = spec.orchestrator_client(retry_timeout=5.0)
        self._generation = 0
        self._world_size = 0

    def launch(self, slot: int) -> WorkerLaunch:
        """The worker inherits the socket holding its port, and the agent lets go of it; a
        restarted worker is a new node, at a fresh address."""
        if slot not in self._held:
            self._addresses[slot], self._held[slot] = self._ports.held_address()
        held = self._held.pop(slot)
        env = {environment.ENDPOINT: self.spec.rdzv_endpoint, environment.RUN_ID: self.spec.run_id,
               environment.ADDRESS: self._addresses[slot],
               environment.ADDRESS_FD: str(held.fileno()),
               environment.MIN_NODES: str(self.spec.min_nodes),
               environment.MAX_NODES: str(self.spec.max_nodes),
               environment.JOIN_TIMEOUT: str(self.spec.join_timeout)}
        if self.spec.token:
            env[environment.TOKEN] = self.spec.token
        if self.spec.tls_ca:
            env[environment.TLS_CA] = self.spec.tls_ca
        return WorkerLaunch(env, [held])

    def form(self) -> None:
        """Nothing to join here: each worker joins when it calls ``tensorflow_elastic.init()``."""

    def observe(self) -> View:
        """Learns node ids of new workers and the current generation (best effort)."""
        self._refresh()
        return View(tuple(self._node_id(slot) for slot in range(len(self._addresses))),
                    self._generation, self._world_size)

    def _refresh(self) -> None:
        try:
            runs = self._status_client.status()
        except RendezvousError:
            return
        for run in runs:
            self._generation = run.membership.generation
            self._world_size = run.membership.world_size
            for node in run.nodes:
                self._node_ids.setdefault(node.address, node.node_id)

    def _node_id(self, slot: int) -> int | None:
        return self._node_ids.get(self._addresses[slot])

    def report_death(self, slot: int, cause: str) -> int | None:
        """Tells the orchestrator that the slot's node died, so its peers re-form at once."""
        if self._node_id(slot) is None:
            self._refresh()  # it may have registered since the last look
        node_id = self._node_id(slot)
        if node_id is None:
            return None  # it died before it registered: nobody waits for it
        try:
            self._status_client.report_death(node_id, cause)
        except RendezvousError as e:
            logger.warning("could not report node %d's death: %s", node_id, e.message)
        return node_id

    def complete(self) -> None:
        """The workers pass their own exit barrier; an agent that hosts the orchestrator also
        waits until no node of the run still heartbeats, so it never pulls the service from
        under workers of other agents."""
        if not self._hosts_orchestrator:
            return
        deadline = time.monotonic() + self.spec.exit_barrier_timeout
        while time.monotonic() < deadline:
            try:
                runs = self._status_client.status()
            except RendezvousError as e:
                if e.reason == UNKNOWN_RUN:
                    return
                logger.warning("exit barrier: %s", e.message)
                return
            if all(run.state == Phase.FAILED or all(n.silent_s >= QUIET_S for n in run.nodes)
                   for run in runs):
                return
            time.sleep(0.5)
        logger.warning("exit barrier: nodes of run %s still heartbeat after %g s; stopping the "
                       "orchestrator anyway", self.spec.run_id, self.spec.exit_barrier_timeout)

    def leave(self, reason: str) -> None:
        """Workers leave by themselves (SIGTERM: finish the step, commit, leave)."""

    def close(self) -> None:
        for held in self._held.values():
            held.close()
        self._held.clear()
        self._status_client.close()
