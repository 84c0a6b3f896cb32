"""What the agent asks of a mode: how to start a worker, and (collective modes) the orchestrator.

Every mode says how a slot's worker starts (:class:`Mode`); the collective
modes also keep the node's side of the job's membership (:class:`Membership`).
The parameter-server roles have no orchestrator, so they give no membership.
"""

from __future__ import annotations

import dataclasses
import socket
from typing import Protocol

from tensorflow_elastic.launch.decision import Scope
from tensorflow_elastic.membership.node_file import NodeRecord


@dataclasses.dataclass
class WorkerLaunch:
    """A worker's environment, and sockets it inherits (the agent closes its copies)."""

    env: dict[str, str]
    sockets: list[socket.socket] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class View:
    """The agent's view of its slots' nodes; ``changed``: the group must re-form;
    ``records``: what each slot's worker last wrote of itself (empty: the mode has none)."""

    node_ids: tuple[int | None, ...]
    generation: int = 0
    world_size: int = 0
    changed: bool = False
    records: tuple[NodeRecord | None, ...] = ()

    @classmethod
    def unknown(cls, slots: int) -> View:
        return cls((None,) * slots)

    def with_node(self, slot: int, node_id: int | None) -> View:
        ids = list(self.node_ids)
        ids[slot] = node_id
        return dataclasses.replace(self, node_ids=tuple(ids))


class Mode(Protocol):
    """How a slot's worker starts; ``scope`` is what a failure restarts; ``worker_name`` is
    what the agent's lines call a worker (None: its node names it); ``output_label`` prefixes
    its output lines (None: its node, or its slot before it has one)."""

    scope: Scope
    worker_name: str | None
    output_label: str | None

    def launch(self, slot: int) -> WorkerLaunch:
        """The worker's environment for this start of ``slot`` (a restart included)."""


class SpareLaunches(Protocol):
    """A mode whose workers can be started ahead as warm spares (launch/spares.py)."""

    def launch_spare(self, number: int) -> WorkerLaunch:
        """The environment of the launcher's spare `number`, before it has a slot."""

    def adopt_spare(self, slot: int, number: int) -> None:
        """Spare `number` is `slot`'s worker from now on."""


class Membership(Protocol):
    """The node's side of the job's membership at the orchestrator."""

    def form(self) -> View | None:
        """Joins before the whole group (re)starts; the nodes formed, None if the workers join."""

    def observe(self) -> View:
        """The slots' node ids and generation now, and whether the group must re-form."""

    def report_death(self, slot: int, cause: str) -> int | None:
        """Tells the orchestrator the slot's node died; returns that node's id, if it has one."""

    def finished(self, slot: int) -> bool:
        """The slot's worker said its training finished: whatever its exit code, it is done."""

    def complete(self) -> None:
        """The job completed: waits for the other nodes at the exit barrier."""

    def leave(self, reason: str) -> None:
        """The node's workers stop before the job ends."""

    def close(self) -> None: ...
