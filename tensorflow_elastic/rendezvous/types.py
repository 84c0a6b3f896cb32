"""Plain results of the membership service, shared by the server and the client."""

from __future__ import annotations

import dataclasses
import enum
from typing import NamedTuple


class Phase(str, enum.Enum):
    """Where a run stands: FORMING (no generation: gathering min_nodes), ACTIVE
    (a generation runs), or one of its two ends: COMPLETED (every node left) or FAILED.
    The next first join of an ended run starts it afresh.

    A ``str`` so it compares equal to the names the protocol and the client use.
    """

    FORMING = "FORMING"
    ACTIVE = "ACTIVE"
    FAILED = "FAILED"
    COMPLETED = "COMPLETED"

    @property
    def ended(self) -> bool:
        return self in (Phase.FAILED, Phase.COMPLETED)

    def __str__(self) -> str:
        # The bare name in messages and f-strings, not "Phase.ACTIVE".
        return self.value


class JoinEntry(NamedTuple):
    """One node's join: ``node_id`` None for a new node, which the run gives an id; the node
    waits to be a member of a generation newer than ``last_generation``. A tuple: a formation
    makes thousands at once."""

    address: str
    node_id: int | None
    last_generation: int
    nonce: str
    timeout: float


@dataclasses.dataclass(frozen=True)
class Membership:
    """One generation as a node sees it.

    ``members`` maps permanent node ids to addresses; ids are sparse because
    they are never reused. The chief is the member with the lowest id, and a
    node's rank is its position among the sorted ids. ``taken_back_after`` is set on
    the membership a join returns when the orchestrator had removed the node while its
    process lived on: why it was removed.
    """

    node_id: int | None
    generation: int
    members: dict[int, str]
    chief_id: int
    taken_back_after: str = ""

    @property
    def world_size(self) -> int:
        return len(self.members)

    @property
    def rank(self) -> int:
        """The caller's index among the sorted member ids."""
        if self.node_id not in self.members:
            raise ValueError(f"node {self.node_id} is not a member of generation {self.generation}")
        return sorted(self.members).index(self.node_id)

    @property
    def is_chief(self) -> bool:
        return self.node_id == self.chief_id


@dataclasses.dataclass(frozen=True)
class HeartbeatInfo:
    """What a heartbeat tells a node about the run.

    ``waiting`` counts the nodes the next re-form would admit (so a worker
    re-forms to grow only when it helps); ``removed`` counts members of the
    caller's generation that are gone (so it must re-join).
    """

    generation: int
    state: Phase
    waiting: int
    removed: int
    member: bool
    queued: int

    @property
    def change(self) -> int:
        """Nodes waiting to join (+) or removed (-): removals take precedence."""
        return -self.removed if self.removed else self.waiting


@dataclasses.dataclass(frozen=True)
class MembershipUpdate:
    """What a watch delivers: the membership (``node_id`` None), the run state and why it
    changed."""

    membership: Membership
    state: Phase
    waiting: int
    reason: str


@dataclasses.dataclass(frozen=True)
class NodeStatus:
    node_id: int
    address: str
    role: str
    silent_s: float


@dataclasses.dataclass(frozen=True)
class RunStatus:
    """One run as ``tfelastic status`` shows it; ``history`` holds dicts with time,
    event, generation, nodes and detail, oldest first."""

    run_id: str
    min_nodes: int
    max_nodes: int
    state: Phase
    reason: str
    membership: Membership
    nodes: list[NodeStatus]
    history: list[dict]
    blocklist: list[tuple[str, int, float]]


@dataclasses.dataclass(frozen=True)
class NodeBounds:
    """How many nodes a run trains with: it starts with ``min_nodes`` and takes in up to
    ``max_nodes``. Checked here, once, where a launcher or a worker first reads them; the
    orchestrator owns them after the run's first join."""

    min_nodes: int
    max_nodes: int

    def __post_init__(self) -> None:
        if not 1 <= self.min_nodes <= self.max_nodes:
            raise ValueError(f"need 1 <= min_nodes <= max_nodes, got "
                             f"{self.min_nodes}:{self.max_nodes}")

    def __str__(self) -> str:
        return f"{self.min_nodes}:{self.max_nodes}"
