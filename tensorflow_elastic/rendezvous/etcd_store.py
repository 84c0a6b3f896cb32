"""Run snapshots in etcd, written only by the replica that leads.

One key per run (``PREFIX/runs/<sha256 of the run id>``). Its value is the JSON
snapshot, or, for a snapshot over :data:`PART_BYTES` (the values members
exchanged), a head naming the parts it was written in (``PREFIX/parts/<sha256>/
<tag>/<index>``): no request grows past etcd's request limit (1.5 MiB by
default) however large the exchanged values are. The parts are written first,
each in a transaction of its own; the head then switches to them and drops the
parts it named before, in one transaction, so a reader sees a whole snapshot or
the one before. Parts no head names (a save cut short) are dropped at the next
load. Loads read page by page, never one answer over gRPC's receive limit.

A run's node records are kept apart from its snapshot (see node_log.py): each save
appends the records that changed as the next key of the run's log (``PREFIX/nodes/
<sha256>/<tag>/<sequence>``), in the head's transaction when it is small, before
it (like parts) when not; the head names the log and how many of its keys it covers.
A new base is a new tag, whose head drops the former tag's keys.

Every write is a transaction that succeeds only while this replica's leader key
is the one it created and the run's key is still at the revision this replica
last wrote or read: two would-be leaders can never both write, so no node id is
handed out twice. A write that fails that test, or that cannot reach etcd before
the leadership's local deadline, raises :class:`NotLeaderError`: the caller is
told to go to the leading replica, and this replica stops leading. A failed test
is read again first: a transaction sent again after a timeout may find that its
first attempt was applied, which is no conflict. A request etcd refuses as too
large raises :class:`StoreLimitError`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from typing import Any, Callable

from tensorflow_elastic.rendezvous import etcd, node_log
from tensorflow_elastic.rendezvous.errors import NotLeaderError, StoreLimitError
from tensorflow_elastic.rendezvous.leader import Election
from tensorflow_elastic.rendezvous.node_log import NodeTable
from tensorflow_elastic.rendezvous.store import MembershipStore, Snapshot, check_snapshot

logger = logging.getLogger(__name__)

_RETRY_S = 0.05
# A snapshot larger than this is written in parts of this size (see etcd.SCAN_PAGE).
PART_BYTES = 256 * 1024
_PARTS_FIELD = "parts"


class EtcdStore(MembershipStore):
    """Snapshots under ``prefix`` in etcd, guarded by ``election``'s leader key."""

    def __init__(self, client: etcd.EtcdClient, prefix: str, election: Election,
                 on_conflict: Callable[[str], None] = lambda cause: None):
        self._client = client
        self._runs = f"{prefix}/runs/".encode()
        self._parts = f"{prefix}/parts/".encode()
        self._nodes = f"{prefix}/nodes/".encode()
        self._set_aside_prefix = f"{prefix}/corrupt/".encode()
        self._leader_key = leader_key(prefix)
        self._election = election
        self._on_conflict = on_conflict
        # run id -> the revision its key was last written or read at (0: no key).
        self._revisions: dict[str, int] = {}
        # run id -> the key prefix of the parts its head names (absent: the snapshot is whole).
        self._part_sets: dict[str, bytes] = {}
        # run id -> its node records as saved, and (its log's key prefix, keys the head names).
        self._tables: dict[str, NodeTable] = {}
        self._node_logs: dict[str, tuple[bytes, int]] = {}

    @property
    def leading(self) -> bool:
        return self._election.leading

    def _key(self, run_id: str) -> bytes:
        return self._runs + _digest(run_id)

    def _run_parts(self, run_id: str) -> bytes:
        return self._parts + _digest(run_id) + b"/"

    def _run_nodes(self, run_id: str) -> bytes:
        return self._nodes + _digest(run_id) + b"/"

    def load(self) -> dict[str, Snapshot]:
        runs = {}
        self._revisions.clear()
        self._part_sets.clear()
        self._tables.clear()
        self._node_logs.clear()
        for kv in self._scan("load the runs", self._runs):
            try:
                snapshot, parts = self._read_head(kv.value)
                snapshot = self._read_node_log(check_snapshot(snapshot))
            except ValueError as e:
                self._set_aside_key(kv.key, kv.value, kv.mod_revision, str(e))
                continue
            run_id = snapshot["run_id"]
            if kv.key != self._key(run_id):
                self._set_aside_key(kv.key, kv.value, kv.mod_revision,
                                    f"its key does not belong to run {run_id!r}")
                continue
            runs[run_id] = snapshot
            self._revisions[run_id] = kv.mod_revision
            if parts is not None:
                self._part_sets[run_id] = parts
        self._drop_unnamed_parts()
        return runs

    def _read_node_log(self, header: Snapshot) -> Snapshot:
        """The whole snapshot of a header and the node log it names; ValueError when the log
        cannot be read. Keys past those the header names (a save cut short) are dropped."""
        log = header.get(node_log.LOG_FIELD)
        if log is None:
            return header  # the former whole-snapshot format
        run_id = header["run_id"]
        try:
            prefix, count = log["prefix"].encode(), log["count"]
            own = prefix.startswith(self._run_nodes(run_id)) and isinstance(count, int)
        except (TypeError, KeyError, AttributeError):
            own = False
        if not own:
            raise ValueError("its head names no node log of its own")
        table = NodeTable()
        found = 0
        for kv in self._scan("load the node log of a run", prefix):
            sequence = kv.key[len(prefix):]
            if not sequence.isdigit() or int(sequence) != found:
                raise ValueError(f"its node log lacks key {found} of {count}")
            if found < count:
                table.apply(json.loads(kv.value))
            else:
                self._write("drop node records no head names", [], [etcd.delete(kv.key)])
            found += 1
        if found < count:
            raise ValueError(f"its node log has {found} of the {count} keys its head names")
        self._tables[run_id] = table
        self._node_logs[run_id] = (prefix, count)
        return node_log.joined(header, table)

    def _read_head(self, value: bytes) -> tuple[Any, bytes | None]:
        """The snapshot a run's value holds or names, and the prefix of its parts (None: it is
        whole); ValueError when it cannot be read."""
        head = json.loads(value)
        parts = head.get(_PARTS_FIELD) if isinstance(head, dict) else None
        if parts is None:
            return head, None
        try:
            prefix, count, digest = parts["prefix"].encode(), parts["count"], parts["sha256"]
            own = prefix.startswith(self._run_parts(head["run_id"]))
        except (TypeError, KeyError, AttributeError):
            raise ValueError("a head of parts that names no parts") from None
        if not own:
            raise ValueError("its head names parts of another run")
        pieces = [kv.value for kv in self._scan("load the parts of a run", prefix)]
        data = b"".join(pieces)
        if len(pieces) != count or hashlib.sha256(data).hexdigest() != digest:
            raise ValueError(f"{count} part(s) named, {len(pieces)} found, or damaged")
        return json.loads(data), prefix

    def _drop_unnamed_parts(self) -> None:
        """Drops the parts and node logs no run's head names (and no set-aside head): saves
        cut short, bases replaced."""
        named = set(self._part_sets.values())
        named.update(prefix for prefix, _ in self._node_logs.values())
        for kv in self._scan("read the set-aside runs", self._set_aside_prefix):
            try:
                head = json.loads(kv.value)
            except ValueError:
                continue
            for field in (_PARTS_FIELD, node_log.LOG_FIELD):
                try:
                    named.add(head[field]["prefix"].encode())
                except (TypeError, KeyError, AttributeError):
                    continue
        unnamed = set()
        for where in (self._parts, self._nodes):
            for kv in self._scan("list the parts", where, keys_only=True):
                part_set = kv.key[:kv.key.rindex(b"/") + 1]
                if part_set not in named:
                    unnamed.add(part_set)
        for part_set in sorted(unnamed):
            self._write("drop parts no run names", [], [etcd.delete_prefix(part_set)])

    def set_aside(self, run_id: str, reason: str) -> None:
        key = self._key(run_id)
        kv = self._with_retry("read a run", lambda: self._client.get(key))
        if kv is not None:
            self._set_aside_key(key, kv.value, kv.mod_revision, reason)
        self._forget(run_id)

    def _forget(self, run_id: str) -> None:
        self._revisions.pop(run_id, None)
        self._part_sets.pop(run_id, None)
        self._tables.pop(run_id, None)
        self._node_logs.pop(run_id, None)

    def _set_aside_key(self, key: bytes, value: bytes, revision: int, reason: str) -> None:
        aside = self._set_aside_prefix + key[len(self._runs):]
        self._write(f"set aside {key!r}", [etcd.modified_at(key, revision)],
                    [etcd.put(aside, value), etcd.delete(key)])
        logger.error("run state at etcd key %r cannot be restored (%s); moved it to %r and "
                     "serving the other runs", key.decode(errors="replace"), reason,
                     aside.decode(errors="replace"))

    def save(self, run_id: str, snapshot: Snapshot) -> None:
        header, changes = node_log.split(snapshot)
        table, log = self._tables.get(run_id), self._node_logs.get(run_id)
        replaced_log = None
        if table is None or log is None or table.compacts_with(changes):
            new_table = (table or NodeTable()).after(changes)
            records, replaced_log = new_table.base(), log
            log = (self._run_nodes(run_id) + os.urandom(8).hex().encode() + b"/", 0)
        else:
            new_table, records = None, changes
        chunks = _chunks(records) if records or new_table is not None else []
        keys = [log[0] + f"{log[1] + i:08d}".encode() for i in range(len(chunks))]
        with_head = []
        if sum(map(len, chunks)) <= PART_BYTES:
            with_head = [etcd.put(key, chunk) for key, chunk in zip(keys, chunks)]
        else:
            # Under the head's revision too: a replica that another one wrote past must not
            # overwrite keys of the log they share.
            head = [etcd.modified_at(self._key(run_id), self._revisions.get(run_id, 0))]
            for key, chunk in zip(keys, chunks):
                self._write(f"save node records of run {run_id!r}", head, [etcd.put(key, chunk)],
                            written=(key, chunk))
        log = (log[0], log[1] + len(chunks))
        header[node_log.LOG_FIELD] = {"prefix": log[0].decode(), "count": log[1]}
        if replaced_log is not None:
            with_head.append(etcd.delete_prefix(replaced_log[0]))
        self._save_head(run_id, header, with_head)
        if new_table is None:
            table.apply(changes)
        else:
            self._tables[run_id] = new_table
        self._node_logs[run_id] = log

    def _save_head(self, run_id: str, snapshot: Snapshot, with_head: list) -> None:
        """Writes the run's head and ``with_head`` in one transaction."""
        key = self._key(run_id)
        data = json.dumps(snapshot, separators=(",", ":")).encode()
        parts = None
        if len(data) > PART_BYTES:
            parts = self._run_parts(run_id) + os.urandom(8).hex().encode() + b"/"
            data = self._write_parts(run_id, parts, data)
        replaced = self._part_sets.get(run_id)
        self._revisions[run_id] = self._write(
            f"save run {run_id!r}", [etcd.modified_at(key, self._revisions.get(run_id, 0))],
            [*with_head, etcd.put(key, data),
             *([etcd.delete_prefix(replaced)] if replaced else [])],
            written=(key, data))
        if parts is None:
            self._part_sets.pop(run_id, None)
        else:
            self._part_sets[run_id] = parts

    def _write_parts(self, run_id: str, prefix: bytes, data: bytes) -> bytes:
        """Writes ``data`` in parts under ``prefix``; returns the head that names them."""
        count = 0
        for count, start in enumerate(range(0, len(data), PART_BYTES), start=1):
            key, part = prefix + f"{count - 1:06d}".encode(), data[start:start + PART_BYTES]
            self._write(f"save part {count} of run {run_id!r}", [], [etcd.put(key, part)],
                        written=(key, part))
        head = {"run_id": run_id, _PARTS_FIELD: {
            "prefix": prefix.decode(), "count": count,
            "sha256": hashlib.sha256(data).hexdigest()}}
        return json.dumps(head, separators=(",", ":")).encode()

    def delete(self, run_id: str) -> None:
        key = self._key(run_id)
        revision = self._revisions.get(run_id, 0)
        if revision:
            self._write(f"delete run {run_id!r}", [etcd.modified_at(key, revision)],
                        [etcd.delete(key), etcd.delete_prefix(self._run_parts(run_id)),
                         etcd.delete_prefix(self._run_nodes(run_id))],
                        written=(key, None))
        self._forget(run_id)

    def _write(self, what: str, compare: list, success: list,
               written: tuple[bytes, bytes | None] | None = None) -> int:
        """Applies ``success`` if this replica leads and ``compare`` holds; returns the new
        revision. Raises NotLeaderError otherwise.

        ``written``: the key the write leaves at this value (None: deleted); a failed test
        after an attempt that got no answer, finding it so under this replica's leader key,
        was that attempt applied.
        """
        revision = self._election.revision
        if not self._election.leading:
            raise NotLeaderError(f"this orchestrator replica does not lead (any more); cannot "
                                 f"{what}: call the leading replica")
        guard = [etcd.created_at(self._leader_key, revision), *compare]
        reread = [etcd.get(self._leader_key), *([etcd.get(written[0])] if written else [])]
        unanswered = []
        try:
            response = self._with_retry(what, lambda: self._client.txn(
                guard, success, reread, on_unanswered=lambda: unanswered.append(True)))
        except etcd.EtcdRequestTooLarge as e:
            raise StoreLimitError(f"cannot {what}: {e}") from None
        if response.succeeded:
            return response.header.revision
        applied = _applied_revision(response, revision, written) if unanswered else None
        if applied is not None:
            return applied
        cause = (f"cannot {what}: another replica took the lead or wrote the run (the "
                 f"transaction's revision check failed)")
        self._on_conflict(cause)
        raise NotLeaderError(f"this orchestrator replica no longer leads: {cause}")

    def _scan(self, what: str, prefix: bytes, keys_only: bool = False) -> list:
        return self._with_retry(what, lambda: list(self._client.scan(prefix, keys_only)))

    def _with_retry(self, what: str, call: Callable):
        """``call()`` again while etcd does not answer and this replica may still lead (or,
        for a standby, for one lease TTL)."""
        give_up = time.monotonic() + self._election.margin
        while True:
            try:
                return call()
            except etcd.EtcdUnavailable as e:
                if not self._election.leading and time.monotonic() > give_up:
                    raise NotLeaderError(f"cannot {what}: {e}; this replica stops leading "
                                         f"until etcd answers") from None
            time.sleep(_RETRY_S)


def _applied_revision(response, leader_revision: int,
                      written: tuple[bytes, bytes | None] | None) -> int | None:
    """The revision of a write found applied by the re-read of a failed transaction (an
    earlier attempt of it committed before its answer was lost); None: a real conflict."""
    if written is None:
        return None
    leader = response.responses[0].response_range.kvs
    if not leader or leader[0].create_revision != leader_revision:
        return None
    found = response.responses[1].response_range.kvs
    _, value = written
    if value is None:
        return None if found else response.header.revision
    return found[0].mod_revision if found and found[0].value == value else None


def _chunks(records: list) -> list[bytes]:
    """``records`` as JSON lists of at most PART_BYTES each (one list, maybe empty, if small)."""
    pieces = 1
    while True:
        size = -(-len(records) // pieces) or 1
        chunks = [json.dumps(records[i:i + size], separators=(",", ":")).encode()
                  for i in range(0, max(len(records), 1), size)]
        if all(len(chunk) <= PART_BYTES for chunk in chunks) or size == 1:
            return chunks
        pieces = max(pieces * 2, sum(map(len, chunks)) // PART_BYTES + 1)


def _digest(run_id: str) -> bytes:
    return hashlib.sha256(run_id.encode()).hexdigest().encode()


def leader_key(prefix: str) -> bytes:
    return f"{prefix}/leader".encode()
