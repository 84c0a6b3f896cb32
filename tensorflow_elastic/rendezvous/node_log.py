"""A run's node records saved as a base plus a log of what each save changed.

A run of 10,000 nodes would otherwise write all of its nodes at every save, and saves
follow each other for as long as joins arrive: the store's cost would grow with the
run's size, not with what changed. A save hands the store its header (the run without
its node records, small) and the records that changed since the last durable save; the
store appends those to the run's log and writes the header naming how much of the log
it covers, so a reader sees the records of one save or of the one before. Once the log
holds more records than the table it describes (plus :data:`COMPACT_SLACK`), the store
writes the whole table as a new base and drops the old log.

A save that changes most records (a generation forming from the waiting nodes) writes a
new base rather than logging them all.

A record is ``[node_id, address, nonce, waiting]`` (waiting: 1 or 0); ``[node_id]`` says
the node is gone. Sets of node ids (members, past generations) are saved as id ranges.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

# Records a log may hold beyond its table's size before the store writes a new base.
COMPACT_SLACK = 1000
# The snapshot field with the changed records (to the store) or the whole table (from it).
CHANGES_FIELD = "node_changes"
TABLE_FIELD = "nodes"
# The header field that says where a run's log is and how much of it the header covers.
LOG_FIELD = "node_log"

Record = list[Any]


def id_ranges(ids: Iterable[int]) -> list[list[int]]:
    """``ids`` as sorted ``[first, last]`` ranges: a generation's members are mostly one."""
    ranges: list[list[int]] = []
    for node_id in sorted(ids):
        if ranges and node_id == ranges[-1][1] + 1:
            ranges[-1][1] = node_id
        else:
            ranges.append([node_id, node_id])
    return ranges


def ids_in(ranges: Sequence[Sequence[int]]) -> list[int]:
    """The ids ``ranges`` (from id_ranges) cover; ValueError when they are no ranges."""
    ids: list[int] = []
    for first, last in ranges:
        if not isinstance(first, int) or not isinstance(last, int) or last < first:
            raise ValueError(f"not an id range: {[first, last]}")
        ids.extend(range(first, last + 1))
    return ids


class RangeCache:
    """Id ranges of collections that are replaced, never changed in place (a generation's
    member map, a past generation, a history entry's nodes): each is encoded once."""

    def __init__(self) -> None:
        self._cached: dict[int, tuple[object, list[list[int]]]] = {}
        self._used: dict[int, tuple[object, list[list[int]]]] = {}

    def ranges(self, ids: Iterable[int]) -> list[list[int]]:
        key = id(ids)
        hit = self._cached.get(key)
        if hit is None or hit[0] is not ids:
            hit = (ids, id_ranges(ids))
        self._used[key] = hit
        return hit[1]

    def end_pass(self) -> None:
        """Forgets what the pass that ends did not use (it left the state)."""
        self._cached, self._used = self._used, {}


class NodeTable:
    """A run's node records as its store last wrote them, and how long its log has grown."""

    def __init__(self, records: Iterable[Record] = ()):
        self.records: dict[int, Record] = {}
        self.logged = 0
        self.apply(records)

    def apply(self, changes: Iterable[Record]) -> None:
        """Applies a save's records in order; ValueError when one is malformed."""
        for record in changes:
            if not isinstance(record, list) or not record or not isinstance(record[0], int):
                raise ValueError(f"not a node record: {record!r}")
            if len(record) == 1:
                self.records.pop(record[0], None)
            elif len(record) == 4:
                self.records[record[0]] = record
            else:
                raise ValueError(f"not a node record: {record!r}")
            self.logged += 1

    def after(self, changes: list[Record]) -> NodeTable:
        """A copy with ``changes`` applied, as a new base (nothing logged beyond it)."""
        table = NodeTable(self.records.values())
        table.apply(changes)
        table.logged = len(table.records)
        return table

    def compacts_with(self, changes: list[Record]) -> bool:
        """Whether the save of ``changes`` should write a new base rather than log them."""
        return self.logged + len(changes) > len(self.records) + COMPACT_SLACK

    def base(self) -> list[Record]:
        return [self.records[node_id] for node_id in sorted(self.records)]


def split(snapshot: dict[str, Any]) -> tuple[dict[str, Any], list[Record]]:
    """A snapshot to save as its header and its changed records."""
    header = dict(snapshot)
    changes = header.pop(CHANGES_FIELD, [])
    return header, changes


def joined(header: dict[str, Any], table: NodeTable) -> dict[str, Any]:
    """The snapshot a store loads: the header with the whole table of records."""
    snapshot = dict(header)
    snapshot.pop(LOG_FIELD, None)
    snapshot[TABLE_FIELD] = table.base()
    return snapshot
