"""In-process elasticity: the workers are the orchestrator's nodes; the agent only keeps them alive.

A script that calls ``tensorflow_elastic.init()`` joins the orchestrator
itself (one node per process) and re-forms inside the running processes, so
the agent never restarts a worker for a membership change. It restarts a
worker only when the process died; the new process joins as a new node with
a new address. Each worker tells the agent its node id and generation in a
file the agent names (membership/node_file.py), to prefix output and name
failures; only a worker that died before it wrote one is looked up at the
orchestrator, by the address the agent gave it.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import time

from tensorflow_elastic import environment
from tensorflow_elastic.launch.decision import Scope
from tensorflow_elastic.launch.mode import View, WorkerLaunch
from tensorflow_elastic.launch.ports import PortAllocator
from tensorflow_elastic.launch.spec import WorkerSpec
from tensorflow_elastic.membership import node_file
from tensorflow_elastic.rendezvous import Phase
from tensorflow_elastic.rendezvous.errors import UNKNOWN_RUN, RendezvousError

logger = logging.getLogger(__name__)

# A node silent this long has stopped heartbeating (workers beat every 0.5 s).
QUIET_S = 3.0


class InProcessElasticity:
    """Environment for elastic-aware workers, and the agent's read-only view of the run."""

    scope = Scope.WORKER
    worker_name = None
    output_label = None

    def __init__(self, spec: WorkerSpec, ports: PortAllocator, hosts_orchestrator: bool = False):
        self.spec = spec
        self._ports = ports
        self._hosts_orchestrator = hosts_orchestrator
        self._addresses: list[str] = []
        self._held: dict[int, socket.socket] = {}
        for slot in range(spec.nproc_per_node):
            address, self._held[slot] = ports.held_address()
            self._addresses.append(address)
        # Where each slot's current worker writes its node id (a new file per start).
        self._node_files_dir = tempfile.mkdtemp(prefix="tfe-nodes-")
        self._node_files: list[str] = [""] * spec.nproc_per_node
        self._starts = 0
        self._looked_up: dict[int, int] = {}
        # The running spares' (address, node file), by the agent's number for them.
        self._spares: dict[int, tuple[str, str]] = {}
        self._status_client = spec.orchestrator_client(retry_timeout=5.0)

    def launch(self, slot: int) -> WorkerLaunch:
        """The worker inherits the socket holding its port, and the agent lets go of it; a
        restarted worker is a new node, at a fresh address."""
        if slot not in self._held:
            self._addresses[slot], self._held[slot] = self._ports.held_address()
        held = self._held.pop(slot)
        self._starts += 1
        self._node_files[slot] = os.path.join(self._node_files_dir, f"slot{slot}-{self._starts}")
        self._looked_up.pop(slot, None)
        return self._launch(self._addresses[slot], held, self._node_files[slot])

    def launch_spare(self, number: int) -> WorkerLaunch:
        """A spare's start: an address and a node file of its own until it takes a slot."""
        address, held = self._ports.held_address()
        self._spares[number] = (address, os.path.join(self._node_files_dir, f"spare{number}"))
        return self._launch(address, held, self._spares[number][1])

    def adopt_spare(self, slot: int, number: int) -> None:
        """Spare `number` is the slot's worker from now on: its address and node file are the
        slot's."""
        self._addresses[slot], self._node_files[slot] = self._spares.pop(number)
        self._looked_up.pop(slot, None)

    def _launch(self, address: str, held: socket.socket, node_file_path: str) -> WorkerLaunch:
        env = {environment.NODE_FILE: node_file_path,
               environment.ENDPOINT: self.spec.rdzv_endpoint, environment.RUN_ID: self.spec.run_id,
               environment.ADDRESS: address,
               environment.ADDRESS_FD: str(held.fileno()),
               environment.MIN_NODES: str(self.spec.bounds.min_nodes),
               environment.MAX_NODES: str(self.spec.bounds.max_nodes),
               environment.JOIN_TIMEOUT: str(self.spec.join_timeout)}
        if self.spec.token:
            env[environment.TOKEN] = self.spec.token
        if self.spec.tls_ca:
            env[environment.TLS_CA] = self.spec.tls_ca
        return WorkerLaunch(env, [held])

    def form(self) -> None:
        """Nothing to join here: each worker joins when it calls ``tensorflow_elastic.init()``."""

    def observe(self) -> View:
        """The slots' node ids and the newest generation their workers have told of."""
        records = [node_file.read(path) if path else None for path in self._node_files]
        newest = max((r for r in records if r is not None), key=lambda r: r.generation,
                     default=None)
        return View(tuple(self._node_id(slot, record) for slot, record in enumerate(records)),
                    0 if newest is None else newest.generation,
                    0 if newest is None else newest.world_size, records=tuple(records))

    def _node_id(self, slot: int, record: node_file.NodeRecord | None) -> int | None:
        return record.node_id if record is not None else self._looked_up.get(slot)

    def _look_up(self, slot: int) -> int | None:
        """The node id of a slot whose worker wrote none (it died right after it registered),
        by the address the agent gave it."""
        try:
            runs = self._status_client.status()
        except RendezvousError:
            return None
        for run in runs:
            for node in run.nodes:
                if node.address == self._addresses[slot]:
                    self._looked_up[slot] = node.node_id
                    return node.node_id
        return None

    def finished(self, slot: int) -> bool:
        record = node_file.read(self._node_files[slot]) if self._node_files[slot] else None
        return record is not None and record.finished

    def report_death(self, slot: int, cause: str) -> int | None:
        """Tells the orchestrator that the slot's node died, so its peers re-form at once."""
        record = node_file.read(self._node_files[slot]) if self._node_files[slot] else None
        node_id = record.node_id if record is not None else self._look_up(slot)
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
        shutil.rmtree(self._node_files_dir, ignore_errors=True)
