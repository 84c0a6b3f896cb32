"""What a run must not lose when the orchestrator restarts, its transitions, and the snapshot
it is saved as.

A transition is a :class:`RunState` method that changes the state's fields and returns what
changed, or the step the run takes next: no I/O, no timers, no locks, so the run
(run.py) decides by calling it and does the rest (events, saves, wake-ups, deadlines).

The store writes the snapshot after every membership change; a restarted
orchestrator decodes it and the run goes on. A snapshot carries only the node records that
changed since the last durable save (see node_log.py); the store keeps the rest. Heartbeats
are not in it: every known node gets the reload grace (RunSettings.reload_grace) to
reconnect. A snapshot names its format: the former whole-snapshot one is still read, one of
another format is refused rather than misread.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import enum
import time
from typing import Any, Collection, Iterable

from tensorflow_elastic.rendezvous.blocklist import Blocklist
from tensorflow_elastic.rendezvous.gathers import Gathers
from tensorflow_elastic.rendezvous.node_log import (
    CHANGES_FIELD, TABLE_FIELD, RangeCache, ids_in)
from tensorflow_elastic.rendezvous.settings import RunSettings
from tensorflow_elastic.rendezvous.store import Snapshot
from tensorflow_elastic.rendezvous.types import Phase

SNAPSHOT_FORMAT = 2
# The format that saved every node in every snapshot: still read, never written.
WHOLE_SNAPSHOT_FORMAT = 1
# Removal causes kept per run, the latest ones; an older removed id is still known as removed.
MAX_REMOVED_KEPT = 1000
# Generations whose members are kept (see RunState.past).
PAST_GENERATIONS = 32


@dataclasses.dataclass
class Node:
    node_id: int
    address: str
    # Sent with the node's first join, so a retried join finds the node again.
    nonce: str = ""


class JoinStep(enum.Enum):
    """What a join with a known node id does to the run."""

    # A member re-joined the generation it runs: the members agreed (at a commit boundary) to
    # end it, so the next one forms at once and admits the waiting nodes.
    GROW = "grow"
    # A registered node asks to join for the first time: it waits for the next generation.
    ENQUEUE = "enqueue"
    # Nothing to change (the node waits already, joins again from an older generation, or was
    # removed): the join waits for its answer.
    WAIT = "wait"


class Forming(enum.Enum):
    """Where a forming run stands on its way to a generation."""

    # max_nodes are waiting: the generation forms at once.
    FULL = "full"
    # min_nodes are waiting: the generation forms when the last call ends.
    ENOUGH = "enough"
    # Fewer than min_nodes are waiting: no last call runs.
    TOO_FEW = "too_few"


class AfterRemoval(enum.Enum):
    """What the run does once nodes were removed."""

    # Every node left of its own accord, or every member left having finished the job: it is done.
    COMPLETE = "complete"
    # A member finished the job and others have yet to leave: nothing forms meanwhile.
    FINISHING = "finishing"
    # Members were lost and enough nodes remain: the next generation forms at once.
    RE_FORM = "re_form"
    # Members were lost and fewer than min_nodes remain: the run waits for nodes to come back.
    FALL_BELOW_MIN = "fall_below_min"
    # No member was lost: a forming run may form now that fewer nodes wait.
    MAYBE_FORM = "maybe_form"


@dataclasses.dataclass(frozen=True)
class Removal:
    """What :meth:`RunState.remove` changed, and what the run does next."""

    removed: list[int]  # the ids it removed (those it knew), in the order asked
    lost: list[int]  # the members among them
    next: AfterRemoval


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
    # Members of recent generations (the last PAST_GENERATIONS), oldest first.
    past: collections.OrderedDict[int, frozenset[int]] = dataclasses.field(
        default_factory=collections.OrderedDict)
    # When a run below min_nodes fails unless nodes come back (time.monotonic()).
    below_min_at: float | None = None
    # A member left having finished training (after the exit barrier every member passed): the
    # job is done, so nodes still waiting to join (and a newcomer formed with the members that
    # leave) are told so rather than formed into a new job.
    job_finished: bool = False
    # removed_since's answers for the member map they were counted against: nodes still in a
    # past generation beat until they re-join, and each would cost a pass over every member.
    _removed_counts: tuple[dict[int, str], dict[int, int]] | None = dataclasses.field(
        default=None, compare=False, repr=False)
    # Nodes whose record (address, nonce, waiting or not, gone) changed since the snapshot that
    # last took them (see take_changed); None: not tracked (a store that keeps nothing).
    changed: set[int] | None = dataclasses.field(default_factory=set, compare=False,
                                                 repr=False)

    @classmethod
    def new(cls, run_id: str, min_nodes: int, max_nodes: int, settings: RunSettings) -> RunState:
        return cls(run_id, min_nodes, max_nodes, _new_blocklist(settings),
                   collections.deque(maxlen=settings.history_size))

    # ------------------------------------------------------------------ queries

    def was_removed(self, node_id: int) -> bool:
        """Whether the id was given out and its node removed (ids are never reused)."""
        return node_id not in self.nodes and 0 <= node_id < self.next_id

    def removal_cause(self, node_id: int) -> str:
        return self.removed.get(node_id, f"the cause is no longer kept: only the last "
                                         f"{MAX_REMOVED_KEPT} removals are")

    def is_active_member(self, node_id: int) -> bool:
        """Whether the node is a member of a generation that is running now."""
        return self.phase == Phase.ACTIVE and node_id in self.members

    def registered(self) -> set[int]:
        """Nodes that have an id but neither are members nor wait (standby nodes)."""
        return self.nodes.keys() - self.members.keys() - self.waiting.keys()

    def admissible(self) -> int:
        """How many waiting nodes the next re-form admits."""
        return max(0, min(len(self.waiting), self.max_nodes - len(self.members)))

    def next_members(self, lost: Collection[int] = ()) -> list[int]:
        """The members of the next generation: the current ones but ``lost``, then the waiting
        nodes it admits, lowest ids first, up to max_nodes."""
        survivors = [node_id for node_id in self.members if node_id not in lost]
        slots = self.max_nodes - len(survivors)
        return survivors + sorted(self.waiting)[:max(0, slots)]

    def removed_since(self, generation: int) -> int:
        """How many members of ``generation`` are no longer members (0 while it runs)."""
        past = self.past.get(generation)
        if past is None or generation == self.generation and self.phase == Phase.ACTIVE:
            return 0
        counts = self._removed_counts
        if counts is None or counts[0] is not self.members:
            counts = self._removed_counts = (self.members, {})
        removed = counts[1].get(generation)
        if removed is None:
            removed = counts[1][generation] = len(past - self.members.keys())
        return removed

    def forming(self) -> Forming | None:
        """Where a forming run stands; None when it is not forming."""
        if self.phase != Phase.FORMING or self.job_finished:
            return None
        if len(self.waiting) >= self.max_nodes:
            return Forming.FULL
        return Forming.TOO_FEW if len(self.waiting) < self.min_nodes else Forming.ENOUGH

    def join_step(self, node_id: int, last_generation: int) -> JoinStep:
        """What a join of the known node ``node_id``, last in ``last_generation``, does."""
        if (self.is_active_member(node_id) and last_generation == self.generation
                and not self.job_finished):
            return JoinStep.GROW
        if (node_id not in self.members and node_id not in self.waiting
                and not self.was_removed(node_id)):
            return JoinStep.ENQUEUE
        return JoinStep.WAIT

    def below_min_expired(self, now: float) -> bool:
        """Whether a run below min_nodes waited past its deadline (``now``: time.monotonic())."""
        return (self.phase == Phase.FORMING and self.below_min_at is not None
                and now >= self.below_min_at)

    # -------------------------------------------------------------- transitions

    def take_changed(self) -> set[int]:
        """The nodes whose record changed since the last call."""
        changed = self.changed or set()
        if self.changed is not None:
            self.changed = set()
        return changed

    def _touch(self, node_id: int) -> None:
        if self.changed is not None:
            self.changed.add(node_id)

    def add_node(self, node: Node) -> None:
        self.nodes[node.node_id] = node
        self._touch(node.node_id)
        if node.nonce:
            self.nonces[node.nonce] = node.node_id

    def register(self, address: str, nonce: str) -> Node:
        """Gives a new node the next id."""
        node = Node(self.next_id, address, nonce)
        self.next_id += 1
        self.add_node(node)
        return node

    def enqueue(self, node: Node) -> None:
        """Puts a node in the waiting queue: the next generation admits it."""
        self.waiting[node.node_id] = node
        self._touch(node.node_id)

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

    def form(self, ids: Iterable[int], cause: str) -> list[int]:
        """Starts the next generation with ``ids`` as its members; returns them sorted."""
        ids = sorted(ids)
        self.generation += 1
        self.phase = Phase.ACTIVE
        self.reason = cause
        self.members = {node_id: self.nodes[node_id].address for node_id in ids}
        for node_id in ids:
            if self.waiting.pop(node_id, None) is not None:
                self._touch(node_id)
        self.below_min_at = None
        self.gathers.end()
        self.past[self.generation] = frozenset(ids)
        while len(self.past) > PAST_GENERATIONS:
            self.past.popitem(last=False)
        return ids

    def remove_node(self, node_id: int, cause: str, may_return: bool = False) -> Node | None:
        """Removes a node (its id stays taken); None if it is not known.

        A removed member stays in ``members`` until the next generation forms.
        ``may_return``: its process may be alive (it was only silent), so it may come back.
        """
        node = self.nodes.pop(node_id, None)
        if node is None:
            return None
        self.waiting.pop(node_id, None)
        self._touch(node_id)
        self.nonces.pop(node.nonce, None)
        self.removed[node_id] = cause
        while len(self.removed) > MAX_REMOVED_KEPT:
            del self.removed[next(iter(self.removed))]
        if may_return:
            self.returnable[node_id] = node.address
            while len(self.returnable) > MAX_REMOVED_KEPT:
                del self.returnable[next(iter(self.returnable))]
        return node

    def remove(self, ids: Iterable[int], cause: str, failed: bool,
               may_return: bool = False, job_finished: bool = False) -> Removal:
        """Removes nodes and decides what the run does next.

        ``failed``: they failed, so each lost member's address counts a failure on the
        blocklist. ``may_return``: they were only silent or unreachable (see remove_node).
        ``job_finished``: they left having finished training (see ``job_finished``).
        """
        removed, lost = [], []
        for node_id in ids:
            node = self.remove_node(node_id, cause, may_return)
            if node is None:
                continue
            removed.append(node_id)
            if node_id in self.members:
                lost.append(node_id)
                if failed:
                    self.blocklist.record_failure(node.address)
        if job_finished and not self.job_finished:  # sent only after the exit barrier
            self.job_finished = True
            self.gathers.end()  # whoever waits in one is told the job finished
        if self.job_finished and not self.phase.ended:
            after = (AfterRemoval.FINISHING if any(m in self.nodes for m in self.members)
                     else AfterRemoval.COMPLETE)
        elif not self.nodes and not failed and self.phase != Phase.COMPLETED:
            after = AfterRemoval.COMPLETE
        elif lost and self.phase == Phase.ACTIVE:
            remain = len(self.members) - len(lost) + len(self.waiting)
            after = (AfterRemoval.RE_FORM if remain >= self.min_nodes
                     else AfterRemoval.FALL_BELOW_MIN)
        else:
            after = AfterRemoval.MAYBE_FORM
        return Removal(removed, lost, after)

    def fall_below_min(self, lost: list[int], cause: str, fail_at: float) -> list[int]:
        """Ends the generation that lost ``lost`` with too few nodes left: its survivors wait
        with the others until min_nodes are back, or the run fails at ``fail_at``
        (time.monotonic()). Returns the survivors."""
        survivors = [node_id for node_id in self.members if node_id not in lost]
        self.phase = Phase.FORMING
        self.members = {}
        for node_id in survivors:
            self.waiting[node_id] = self.nodes[node_id]
            self._touch(node_id)
        self.below_min_at = fail_at
        self.reason = (f"lost {lost} ({cause}); {len(self.waiting)} of min_nodes="
                       f"{self.min_nodes} remain")
        self.gathers.end()
        return survivors

    def complete(self, last: list[int], cause: str) -> None:
        """Ends the run when its last node left of its own accord, or its last member left
        having finished the job (nodes still waiting are then told it is complete): done.

        Not a failure, and not below min_nodes either: nobody is expected back.
        """
        self.phase = Phase.COMPLETED
        self.reason = (f"completed: every member left having finished the job (the last: "
                       f"{last}, {cause})" if self.job_finished and self.nodes else
                       f"completed: every node left (the last: {last}, {cause})")
        self.members = {}
        self.below_min_at = None
        self.gathers.end()

    def fail(self, reason: str) -> None:
        self.phase = Phase.FAILED
        self.reason = reason
        self.gathers.end()

    def start_afresh(self, min_nodes: int, max_nodes: int, settings: RunSettings) -> list[int]:
        """Makes an ended run the next job with the same run id; returns the ids of the nodes
        left over from the ended job, which it removes so they cannot mix with the new one.

        Ids and generations keep counting and the history goes on, so nothing of
        the ended job is reused and its ids still name what they named.
        """
        ended = f"run {self.run_id!r} {self.phase.lower()} ({self.reason})"
        left_over = list(self.nodes)
        for node_id in left_over:
            self.remove_node(node_id, f"{ended}; a new job started it afresh")
        self.min_nodes, self.max_nodes = min_nodes, max_nodes
        self.blocklist = _new_blocklist(settings)
        self.gathers = Gathers()
        self.phase = Phase.FORMING
        self.members = {}
        self.returnable = {}
        self.below_min_at = None
        self.job_finished = False
        self.reason = f"a new job started it afresh after: {ended}"
        return left_over

    def note(self, event: str, nodes: list[int], detail: str, now: float) -> None:
        """Records a change in the run's history (``now``: time.time())."""
        self.history.append({"time": now, "event": event, "generation": self.generation,
                             "nodes": nodes, "detail": detail})


def _new_blocklist(settings: RunSettings) -> Blocklist:
    return Blocklist(settings.blocklist_after, settings.blocklist_cooldown,
                     settings.blocklist_max_cooldown)


def encode(state: RunState, changed: Iterable[int] | None = None,
           ranges: RangeCache | None = None) -> Snapshot:
    """The JSON-able snapshot of ``state`` with the records of the ``changed`` nodes only (the
    store has the others; None: every node, a snapshot that decodes alone); deadlines are
    saved as wall-clock times. ``ranges`` encodes the id sets the state replaces whole once
    each, across snapshots."""
    ranges = ranges or RangeCache()
    if changed is None:
        changed = state.nodes
    def record(node_id: int) -> list[Any]:
        node = state.nodes.get(node_id)
        if node is None:
            return [node_id]
        return [node_id, node.address, node.nonce, int(node_id in state.waiting)]

    snapshot = {
        "format": SNAPSHOT_FORMAT, "run_id": state.run_id, "min_nodes": state.min_nodes,
        "max_nodes": state.max_nodes, "next_id": state.next_id,
        "generation": state.generation, "state": state.phase.value, "reason": state.reason,
        "members": ranges.ranges(state.members),
        # Members whose node left while their generation runs (see RunState.remove_node).
        "members_gone": {str(i): state.members[i]
                         for i in sorted(state.members.keys() - state.nodes.keys())},
        CHANGES_FIELD: [record(node_id) for node_id in sorted(changed)],
        "removed": {str(i): cause for i, cause in state.removed.items()},
        "returnable": {str(i): address for i, address in state.returnable.items()},
        "past": [[g, ranges.ranges(ids)] for g, ids in state.past.items()],
        "gathered": {key: {str(i): base64.b64encode(v).decode() for i, v in values.items()}
                     for key, values in state.gathers.completed.items()},
        "blocklist": state.blocklist.snapshot(),
        "below_min_at": (None if state.below_min_at is None
                         else state.below_min_at + _wall_clock_offset()),
        "history": [{**entry, "nodes": ranges.ranges(entry["nodes"])}
                    for entry in state.history],
        "job_finished": state.job_finished,
    }
    ranges.end_pass()
    return snapshot


def decode(snapshot: Snapshot, settings: RunSettings) -> RunState:
    """The state saved as ``snapshot`` (with the store's whole table of node records, or of
    the former whole-snapshot format); raises ValueError for a snapshot of another format.

    The nodes of a whole snapshot are all marked changed: the next save writes them all."""
    snapshot_format = snapshot.get("format")
    if snapshot_format not in (SNAPSHOT_FORMAT, WHOLE_SNAPSHOT_FORMAT):
        raise ValueError(f"run {snapshot.get('run_id')!r}: unknown state format "
                         f"{snapshot_format}; this orchestrator reads formats "
                         f"{WHOLE_SNAPSHOT_FORMAT} and {SNAPSHOT_FORMAT}")
    whole = snapshot_format == WHOLE_SNAPSHOT_FORMAT
    state = RunState.new(snapshot["run_id"], snapshot["min_nodes"], snapshot["max_nodes"],
                         settings)
    state.next_id = snapshot["next_id"]
    state.generation = snapshot["generation"]
    state.phase = Phase(snapshot["state"])
    state.reason = snapshot["reason"]
    if whole:
        _decode_whole_nodes(state, snapshot)
    else:
        _decode_records(state, snapshot)
    state.removed = {int(i): cause for i, cause in snapshot["removed"].items()}
    state.returnable = {int(i): address for i, address in snapshot.get("returnable", {}).items()}
    state.past = collections.OrderedDict(
        (g, frozenset(ids if whole else ids_in(ids))) for g, ids in snapshot["past"])
    state.gathers = Gathers({key: {int(i): base64.b64decode(v) for i, v in values.items()}
                             for key, values in snapshot["gathered"].items()})
    state.blocklist.restore(snapshot["blocklist"])
    if snapshot["below_min_at"] is not None:
        state.below_min_at = snapshot["below_min_at"] - _wall_clock_offset()
    state.job_finished = snapshot.get("job_finished", False)
    state.history.extend(snapshot["history"] if whole else
                         ({**entry, "nodes": ids_in(entry["nodes"])}
                          for entry in snapshot["history"]))
    state.changed = set(state.nodes) if whole else set()
    return state


def _decode_records(state: RunState, snapshot: Snapshot) -> None:
    """Nodes, waiting queue and members from the store's table of node records (or those of a
    snapshot taken of every node)."""
    records = snapshot[TABLE_FIELD] if TABLE_FIELD in snapshot else snapshot[CHANGES_FIELD]
    for node_id, address, nonce, waiting in records:
        node = Node(node_id, address, nonce)
        state.add_node(node)
        if waiting:
            state.waiting[node_id] = node
    gone = snapshot.get("members_gone", {})
    members = {}
    for node_id in ids_in(snapshot["members"]):
        node = state.nodes.get(node_id)
        address = node.address if node is not None else gone.get(str(node_id))
        if address is None:
            raise ValueError(f"run {state.run_id!r}: member {node_id} has no node record")
        members[node_id] = address
    state.members = members


def _decode_whole_nodes(state: RunState, snapshot: Snapshot) -> None:
    """Nodes, waiting queue and members of a snapshot of the former whole-snapshot format."""
    for group in ("members", "waiting", "registered"):
        for node_id, address, nonce in snapshot.get(group, ()):
            node = Node(node_id, address, nonce)
            state.add_node(node)
            if group == "members":
                state.members[node_id] = address
            elif group == "waiting":
                state.waiting[node_id] = node


def _wall_clock_offset() -> float:
    """time.time() minus time.monotonic(): monotonic times mean nothing to another process."""
    return time.time() - time.monotonic()
