"""Run snapshots in etcd, written only by the replica that leads.

One key per run (``PREFIX/runs/<sha256 of the run id>``, the JSON snapshot as
value). Every write is a transaction that succeeds only while this replica's
leader key is the one it created and the run's key is still at the revision
this replica last wrote or read: two would-be leaders can never both write, so
no node id is handed out twice. A write that fails that test, or that cannot
reach etcd before the leadership's local deadline, raises
:class:`NotLeaderError`: the caller is told to go to the leading replica, and
this replica stops leading.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import Callable

from tensorflow_elastic.rendezvous import etcd
from tensorflow_elastic.rendezvous.errors import NotLeaderError
from tensorflow_elastic.rendezvous.leader import Election
from tensorflow_elastic.rendezvous.store import MembershipStore, Snapshot, check_snapshot

logger = logging.getLogger(__name__)

_RETRY_S = 0.05


class EtcdStore(MembershipStore):
    """Snapshots under ``prefix`` in etcd, guarded by ``election``'s leader key."""

    def __init__(self, client: etcd.EtcdClient, prefix: str, election: Election,
                 on_conflict: Callable[[str], None] = lambda cause: None):
        self._client = client
        self._runs = f"{prefix}/runs/".encode()
        self._set_aside_prefix = f"{prefix}/corrupt/".encode()
        self._leader_key = leader_key(prefix)
        self._election = election
        self._on_conflict = on_conflict
        # run id -> the revision its key was last written or read at (0: no key).
        self._revisions: dict[str, int] = {}

    def _key(self, run_id: str) -> bytes:
        return self._runs + hashlib.sha256(run_id.encode()).hexdigest().encode()

    def load(self) -> dict[str, Snapshot]:
        runs = {}
        self._revisions.clear()
        for kv in self._with_retry("load the runs", lambda: self._client.get_prefix(self._runs)):
            try:
                snapshot = check_snapshot(json.loads(kv.value))
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
        return runs

    def set_aside(self, run_id: str, reason: str) -> None:
        key = self._key(run_id)
        kv = self._with_retry("read a run", lambda: self._client.get(key))
        if kv is not None:
            self._set_aside_key(key, kv.value, kv.mod_revision, reason)
        self._revisions.pop(run_id, None)

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
        self._revisions[run_id] = self._write(
            f"save run {run_id!r}", [etcd.modified_at(key, self._revisions.get(run_id, 0))],
            [etcd.put(key, data)])

    def delete(self, run_id: str) -> None:
        key = self._key(run_id)
        revision = self._revisions.get(run_id, 0)
        if revision:
            self._write(f"delete run {run_id!r}", [etcd.modified_at(key, revision)],
                        [etcd.delete(key)])
        self._revisions.pop(run_id, None)

    def _write(self, what: str, compare: list, success: list) -> int:
        """Applies ``success`` if this replica leads and ``compare`` holds; returns the new
        revision. Raises NotLeaderError otherwise."""
        revision = self._election.revision
        if not revision:
            raise NotLeaderError(f"this orchestrator replica does not lead (any more); cannot "
                                 f"{what}: call the leading replica")
        guard = [etcd.created_at(self._leader_key, revision), *compare]
        response = self._with_retry(what, lambda: self._client.txn(guard, success))
        if not response.succeeded:
            cause = (f"cannot {what}: another replica took the lead or wrote the run (the "
                     f"transaction's revision check failed)")
            self._on_conflict(cause)
            raise NotLeaderError(f"this orchestrator replica no longer leads: {cause}")
        return response.header.revision

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


def leader_key(prefix: str) -> bytes:
    return f"{prefix}/leader".encode()
