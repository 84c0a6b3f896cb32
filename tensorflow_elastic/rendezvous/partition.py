"""Who leaves when two live members cannot reach each other (a partition between their hosts).

Each of them reaches the orchestrator, heartbeats on and reports the other unreachable, and the
orchestrator's own probe finds the other alive: nobody is dead, so no removal would end the
collectives they both wait in. The decision is pure, from the reports of one generation: a pair
counts once both of its ends reported each other (one overloaded reporter whose probe timed
out removes nobody), and the fewest members that cover every such pair leave, the one in the
most pairs first, then the newest (highest id): the chief stays when it can. The run removes
them like silent members (they may come back) and blocks their addresses for the blocklist's
cooldown, so that a partition that lasts costs one re-form per cooldown, not a loop.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class PartitionReports:
    """The "reporter cannot reach peer, which the orchestrator reaches" reports of one
    generation (older generations' are dropped when a newer one's arrives)."""

    generation: int = 0
    unreachable: set[tuple[int, int]] = dataclasses.field(default_factory=set)

    def add(self, generation: int, reporter: int, peers: list[int]) -> None:
        if generation > self.generation:
            self.generation, self.unreachable = generation, set()
        if generation == self.generation:
            self.unreachable.update((reporter, peer) for peer in peers)


def who_leaves(reports: PartitionReports, generation: int, members: set[int]) -> list[int]:
    """The members to remove for the mutual reports of `generation` among `members` (sorted;
    none when no pair was reported from both ends)."""
    if reports.generation != generation:
        return []
    pairs = {frozenset(pair) for pair in reports.unreachable
             if pair[::-1] in reports.unreachable and set(pair) <= members}
    leaving = []
    while pairs:
        counts: dict[int, int] = {}
        for pair in pairs:
            for node in pair:
                counts[node] = counts.get(node, 0) + 1
        node = max(counts, key=lambda n: (counts[n], n))
        leaving.append(node)
        pairs = {pair for pair in pairs if node not in pair}
    return sorted(leaving)
