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

from tensorflow_elastic.rendezvous import etcd
from tensorflow_elastic.rendezvous.errors import NotLeaderError, StoreLimitError
from tensorflow_elastic.rendezvous.leader import Election
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
        self._set_aside_prefix = f"{prefix}/corrupt/".encode()
        self._leader_key = leader_key(prefix)
        self._election = election
        self._on_conflict = on_conflict
        # run id -> the revision its key was last written or read at (0: no key).
        self._revisions: dict[str, int] = {}
        # run id -> the key prefix of the parts its head names (absent: the snapshot is whole).
        self._part_sets: dict[str, bytes] = {}

    @property
    def leading(self) -> bool:
        return self._election.leading

    def _key(self, run_id: str) -> bytes:
        return self._runs + _digest(run_id)

    def _run_parts(self, run_id: str) -> bytes:
        return self._parts + _digest(run_id) + b"/"

    def load(self) -> dict[str, Snapshot]:
        runs = {}
        self._revisions.clear()
        self._part_sets.clear()
        for kv in self._scan("load the runs", self._runs):
            try:
                snapshot, parts = self._read_head(kv.value)
                snapshot = check_snapshot(snapshot)
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
        """Drops the parts no run's head names (and no set-aside head): saves cut short."""
        named = set(self._part_sets.values())
        for kv in self._scan("read the set-aside runs", self._set_aside_prefix):
            try:
                parts = json.loads(kv.value).get(_PARTS_FIELD)
                named.add(parts["prefix"].encode())
            except (ValueError, TypeError, KeyError, AttributeError):
                continue
        unnamed = set()
        for kv in self._scan("list the parts", self._parts, keys_only=True):
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
        self._revisions.pop(run_id, None)
        self._part_sets.pop(run_id, None)

    def _set_aside_key(self, key: bytes, value: bytes, revision: int, reason: str) -> None:
        aside = self._set_aside_prefix + key[len(self._runs):]
        self._write(f"set aside {key!r}", [etcd.modified_at(key, revision)],
                    [etcd.put(aside, value), etcd.delete(key)])
        logger.error("run state at etcd key %r cannot be restored (%s); moved it to %r and "
                     "serving the other runs", key.decode(errors="replace"), reason,
                     aside.decode(errors="replace"))

    def save(self, run_id: str, snapshot: Snapshot) -> None:
        key = self._key(run_id)
        data = json.dumps(snapshot, separators=(",", ":")).encode()
        parts = None
        if len(data) > PART_BYTES:
            parts = self._run_parts(run_id) + os.urandom(8).hex().encode() + b"/"
            data = self._write_parts(run_id, parts, data)
        replaced = self._part_sets.get(run_id)
        self._revisions[run_id] = self._write(
            f"save run {run_id!r}", [etcd.modified_at(key, self._revisions.get(run_id, 0))],
            [etcd.put(key, data), *([etcd.delete_prefix(replaced)] if replaced else [])],
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
                        [etcd.delete(key), etcd.delete_prefix(self._run_parts(run_id))],
                        written=(key, None))
        self._revisions.pop(run_id, None)
        self._part_sets.pop(run_id, None)

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


def _digest(run_id: str) -> bytes:
    return hashlib.sha256(run_id.encode()).hexdigest().encode()


def leader_key(prefix: str) -> bytes:
    return f"{prefix}/leader".encode()
