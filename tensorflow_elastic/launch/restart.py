"""Restart-based elasticity for unmodified MultiWorkerMirroredStrategy scripts.

Such a script reads TF_CONFIG once and cannot change its cluster, so the
agent does the elastic part: it holds one orchestrator node per local worker
(joined, heartbeating) and, for every generation, hands each worker a
TF_CONFIG with that generation's members in node-id order. When the
membership changes (a node failed or left, nodes wait to join, a local
worker died and the agent re-joined to end the generation), every agent
stops its workers and starts them again with the new TF_CONFIG; the script
resumes from its own BackupAndRestore or checkpoint.
"""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from tensorflow_elastic import environment
from tensorflow_elastic.launch.decision import Scope
from tensorflow_elastic.launch.mode import View, WorkerLaunch
from tensorflow_elastic.launch.spec import WorkerSpec
from tensorflow_elastic.rendezvous import Client, HeartbeatInfo, Membership, Phase
from tensorflow_elastic.rendezvous.client import join_together
from tensorflow_elastic.rendezvous.errors import (
    GenerationChangedError, NodeRemovedError, RendezvousError, RunFailedError)
from tensorflow_elastic.rendezvous.settings import heartbeat_interval

logger = logging.getLogger(__name__)


def _joined(result: Membership | RendezvousError) -> Membership:
    """A slot's join result; a failed run ends the agent's launch with the orchestrator's
    reason."""
    if isinstance(result, RunFailedError):
        raise RuntimeError(f"the run failed on the orchestrator: {result.message}") from None
    if isinstance(result, RendezvousError):
        raise result
    return result


def tf_config(membership: Membership, node_id: int) -> str:
    """The TF_CONFIG of one worker: the members as a dense worker list, ranked by node id."""
    members = membership.members
    order = sorted(members)
    return json.dumps({"cluster": {"worker": [members[m] for m in order]},
                       "task": {"type": "worker", "index": order.index(node_id)}})


class RestartElasticity:
    """The agent's orchestrator nodes (one per local worker) and when to restart them all."""

    scope = Scope.GROUP
    worker_name = None
    output_label = None

    def __init__(self, spec: WorkerSpec, addresses: list[str], wake: threading.Event):
        self.spec = spec
        self._addresses = addresses
        self._wake = wake
        self._changed = threading.Event()
        self._clients = [self._new_client() for _ in addresses]
        self._joined: Membership | None = None
        self._generation = 0

    # --------------------------------------------------------------- rendezvous

    def form(self) -> View:
        """Joins (or re-joins) every local node; returns the generation they all belong to."""
        for slot, client in enumerate(self._clients):
            if isinstance(client.heartbeat_error, NodeRemovedError):
                # The orchestrator gave up on this node (e.g. it stalled): come back as a new one.
                logger.warning("node %s was removed (%s); joining as a new node", client.node_id,
                               client.heartbeat_error)
                client.close()
                self._clients[slot] = self._new_client()
        memberships = self._join_all()
        # Slots that joined a generation a moment before the others' join ended it catch up.
        latest = max(m.generation for m in memberships)
        for slot, m in enumerate(memberships):
            if m.generation < latest:
                memberships[slot] = _joined(join_together(
                    [self._clients[slot]], timeout=self.spec.join_timeout)[0])
        self._joined = memberships[0]
        self._generation = self._joined.generation
        self._changed.clear()
        return self._view()

    def _join_all(self) -> list[Membership]:
        """Joins every slot in one call (join_together: only the first slot's membership
        carries the member map, which the workers' TF_CONFIG is built from); a slot that
        joined as a new node starts beating."""
        new = [c.node_id is None for c in self._clients]
        for slot, client in enumerate(self._clients):
            if new[slot]:
                client.bind(self._addresses[slot], self.spec.bounds.min_nodes,
                            self.spec.bounds.max_nodes)
        results = join_together(self._clients, timeout=self.spec.join_timeout)
        for slot, client in enumerate(self._clients):
            if new[slot] and not isinstance(results[slot], RendezvousError):
                client.start_heartbeats(heartbeat_interval(), self._on_heartbeat)
        return [_joined(result) for result in results]

    def _new_client(self) -> Client:
        return self.spec.orchestrator_client()

    def _on_heartbeat(self, info: HeartbeatInfo) -> None:
        world = 0 if self._joined is None else self._joined.world_size
        if (info.state == Phase.FAILED or info.generation > self._generation or info.removed
                or (info.waiting > 0 and world < self.spec.bounds.max_nodes)):
            self._changed.set()
            self._wake.set()

    # ------------------------------------------------------------------ queries

    def observe(self) -> View:
        """Heartbeat replies keep this view current; a failed heartbeat is a change too."""
        return self._view(changed=self._changed.is_set()
                          or any(c.heartbeat_error is not None for c in self._clients))

    def _view(self, changed: bool = False) -> View:
        world = 0 if self._joined is None else self._joined.world_size
        return View(tuple(c.node_id for c in self._clients), self._generation, world, changed)

    def launch(self, slot: int) -> WorkerLaunch:
        """Stock TensorFlow workers bind their TF_CONFIG address themselves: no socket to pass;
        a restarted worker keeps its node and address."""
        node_id = self._clients[slot].node_id
        return WorkerLaunch({"TF_CONFIG": tf_config(self._joined, node_id),
                             environment.NODE_ID: str(node_id),
                             environment.GENERATION: str(self._generation)})

    # ----------------------------------------------------------------- endings

    def complete(self) -> None:
        """Waits until every member's workers finished too, so no agent leaves a generation
        early; then leaves."""
        def enter(client: Client) -> None:
            try:
                client.barrier(f"exit-{self._generation}", timeout=self.spec.exit_barrier_timeout)
            except GenerationChangedError:
                pass  # a member that passed the barrier already left
            except RendezvousError as e:
                logger.warning("exit barrier of node %s: %s", client.node_id, e.message)

        with ThreadPoolExecutor(len(self._clients)) as pool:
            list(pool.map(enter, self._clients))
        self.leave("job complete", job_finished=True)

    def finished(self, slot: int) -> bool:
        """A stock worker says nothing of its training: its exit code is its end."""
        return False

    def report_death(self, slot: int, cause: str) -> int | None:
        """The agent's own clients are the members: the restart of the group is the report."""
        return self._clients[slot].node_id

    def leave(self, reason: str, job_finished: bool = False) -> None:
        for client in self._clients:
            client.stop_heartbeats()
            if client.node_id is None:
                continue
            try:
                client.leave(reason, job_finished=job_finished)
            except RendezvousError as e:
                logger.warning("node %s could not leave: %s", client.node_id, e.message)

    def close(self) -> None:
        for client in self._clients:
            client.close()
