"""What a run must not lose when the orchestrator restarts, and the snapshot it is saved as.

The store writes the snapshot after every membership change; a restarted
orchestrator decodes it and the run goes on. Heartbeats are not in it: every
known node gets a full heartbeat timeout to reconnect. A snapshot names its
format, and one of another format is refused rather than misread.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import time
from typing import Any, Iterable

from tensorflow_elastic.rendezvous.blocklist import Blocklist
from tensorflow_elastic.rendezvous.gathers import Gathers
from tensorflow_elastic.rendezvous.settings import RunSettings
from tensorflow_elastic.rendezvous.store import Snapshot
from tensorflow_elastic.rendezvous.types import Phase

SNAPSHOT_FORMAT = 1
# Removal causes kept per run, the latest ones; an older removed id is still known as removed.
MAX_REMOVED_KEPT = 1000


@dataclasses.dataclass
class Node:
    node_id: int
    address: str
    # Sent with the node's first join, so a retried join finds the node again.
    nonce: str = ""


@dataclasses.dataclass
class RunState:
    """One run: its nodes and generations, and the exchanges, blocklist and history that go with
    them.

    Node ids are never reused: ``next_id`` only grows and a removed id keeps its cause.
    """

    run_id: str
    min_nodes: int
    max_nodes: int
    blocklist: Blocklist
    history: collections.deque[dict[str, Any]]
    gathers: Gathers = dataclasses.field(default_factory=Gathers)
    next_id: int = 0
    generation: int = 0
    phase: Phase = Phase.FORMING
    reason: str = ""
    # Every node that has an id and was not removed: members, waiting and registered ones.
    nodes: dict[int, Node] = dataclasses.field(default_factory=dict)
    nonces: dict[str, int] = dataclasses.field(default_factory=dict)
    # The current generation's members: node id -> address.
    members: dict[int, str] = dataclasses.field(default_factory=dict)
    waiting: dict[int, Node] = dataclasses.field(default_factory=dict)
    removed: dict[int, str] = dataclasses.field(default_factory=dict)
    # Removed nodes whose process may still be alive (it went silent, it was cut off, it hung),
    # by id -> address: such a node comes back with its id; see :meth:`take_back`.
    returnable: dict[int, str] = dataclasses.field(default_factory=dict)
    # Members of recent generations, oldest first.
    past: collections.OrderedDict[int, frozenset[int]] = dataclasses.field(
        default_factory=collections.OrderedDict)
    # When a run below min_nodes fails unless nodes come back (time.monotonic()).
    below_min_at: float | None = None

    @classmethod
    def new(cls, run_id: str, min_nodes: int, max_nodes: int, settings: RunSettings) -> RunState:
        return cls(run_id, min_nodes, max_nodes, _new_blocklist(settings),
                   collections.deque(maxlen=settings.history_size))

    def start_afresh(self, min_nodes: int, max_nodes: int, settings: RunSettings) -> None:
        """Makes an ended run (its nodes removed) the next job with the same run id.

        Ids and generations keep counting and the history goes on, so nothing of
        the ended job is reused and its ids still name what they named.
        """
        self.min_nodes, self.max_nodes = min_nodes, max_nodes
        self.blocklist = _new_blocklist(settings)
        self.gathers = Gathers()
        self.phase = Phase.FORMING
        self.members = {}
        self.returnable = {}
        self.below_min_at = None

    def add_node(self, node: Node) -> None:
        self.nodes[node.node_id] = node
        if node.nonce:
            self.nonces[node.nonce] = node.node_id

    def remove_node(self, node_id: int, cause: str, may_return: bool = False) -> Node | None:
        """Removes a node (its id stays taken); None if it is not known.

        A removed member stays in ``members`` until the next generation forms.
        ``may_return``: its process may be alive (it was only silent), so it may come back.
        """
        node = self.nodes.pop(node_id, None)
        if node is None:
            return None
        self.waiting.pop(node_id, None)
        self.nonces.pop(node.nonce, None)
        self.removed[node_id] = cause
        while len(self.removed) > MAX_REMOVED_KEPT:
            del self.removed[next(iter(self.removed))]
        if may_return:
            self.returnable[node_id] = node.address
            while len(self.returnable) > MAX_REMOVED_KEPT:
                del self.returnable[next(iter(self.returnable))]
        return node

    def take_back(self, node_id: int, address: str, nonce: str) -> Node | None:
        """Re-admits a removed node that may return, when it comes back from its own address.

        Its process kept running (a host cut off, then reachable again; a process frozen,
        then resumed): its TensorFlow server keeps its task id, so it keeps its node id.
        None when the node may not return (it died, it left) or another address claims it.
        """
        if self.returnable.get(node_id) != address:
            return None
        del self.returnable[node_id]
        self.removed.pop(node_id, None)
        node = Node(node_id, address, nonce)
        self.add_node(node)
        return node

    def was_removed(self, node_id: int) -> bool:
        """Whether the id was given out and its node removed (ids are never reused)."""
        return node_id not in self.nodes and 0 <= node_id < self.next_id

    def removal_cause(self, node_id: int) -> str:
        return self.removed.get(node_id, f"the cause is no longer kept: only the last "
                                         f"{MAX_REMOVED_KEPT} removals are")


def _new_blocklist(settings: RunSettings) -> Blocklist:
    return Blocklist(settings.blocklist_after, settings.blocklist_cooldown,
                     settings.blocklist_max_cooldown)


def encode(state: RunState) -> Snapshot:
    """The JSON-able snapshot of ``state``; deadlines are saved as wall-clock times."""
    def nodes(ids: Iterable[int]) -> list[list[Any]]:
        return [[i, state.nodes[i].address, state.nodes[i].nonce] for i in sorted(ids)]

    return {
        "format": SNAPSHOT_FORMAT, "run_id": state.run_id, "min_nodes": state.min_nodes,
        "max_nodes": state.max_nodes, "next_id": state.next_id,
        "generation": state.generation, "state": state.phase.value, "reason": state.reason,
        "members": nodes(state.members), "waiting": nodes(state.waiting),
        "registered": nodes(state.nodes.keys() - state.members.keys() - state.waiting.keys()),
        "removed": {str(i): cause for i, cause in state.removed.items()},
        "returnable": {str(i): address for i, address in state.returnable.items()},
        "past": [[g, sorted(ids)] for g, ids in state.past.items()],
        "gathered": {key: {str(i): base64.b64encode(v).decode() for i, v in values.items()}
                     for key, values in state.gathers.completed.items()},
        "blocklist": state.blocklist.snapshot(),
        "below_min_at": (None if state.below_min_at is None
                         else state.below_min_at + _wall_clock_offset()),
        "history": list(state.history),
    }


def decode(snapshot: Snapshot, settings: RunSettings) -> RunState:
    """The state saved as ``snapshot``; raises ValueError for a snapshot of another format."""
    if snapshot.get("format") != SNAPSHOT_FORMAT:
        raise ValueError(f"run {snapshot.get('run_id')!r}: unknown state format "
                         f"{snapshot.get('format')}")
    state = RunState.new(snapshot["run_id"], snapshot["min_nodes"], snapshot["max_nodes"],
                         settings)
    state.next_id = snapshot["next_id"]
    state.generation = snapshot["generation"]
    state.phase = Phase(snapshot["state"])
    state.reason = snapshot["reason"]
    for group in ("members", "waiting", "registered"):
        for node_id, address, nonce in snapshot.get(group, ()):
            node = Node(node_id, address, nonce)
            state.add_node(node)
            if group == "members":
                state.members[node_id] = address
            elif group == "waiting":
                state.waiting[node_id] = node
    state.removed = {int(i): cause for i, cause in snapshot["removed"].items()}
    state.returnable = {int(i): address for i, address in snapshot.get("returnable", {}).items()}
    state.past = collections.OrderedDict((g, frozenset(ids)) for g, ids in snapshot["past"])
    state.gathers = Gathers({key: {int(i): base64.b64decode(v) for i, v in values.items()}
                             for key, values in snapshot["gathered"].items()})
    state.blocklist.restore(snapshot["blocklist"])
    if snapshot["below_min_at"] is not None:
        state.below_min_at = snapshot["below_min_at"] - _wall_clock_offset()
    state.history.extend(snapshot["history"])
    return state


def _wall_clock_offset() -> float:
    """time.time() minus time.monotonic(): monotonic times mean nothing to another process."""
    return time.time() - time.monotonic()
