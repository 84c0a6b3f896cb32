"""Which orchestrator replica leads: an etcd key held under a lease.

Every replica holds a lease and keeps it alive. The leader key is created, in a
transaction that only succeeds while the key does not exist, under the lease of
the replica that wins; it goes when that lease expires (the leader died or lost
etcd) or is revoked (it stopped), and a standby's next attempt takes it.

A leader acts only until a local deadline that ends before its lease can
expire: the lease was renewed no earlier than the moment the renewal was sent,
so it lives at least ``TTL`` from then; the leader stops ``margin`` earlier.
So a replica cut off from etcd stops leading before any other can start, and
every write of the store is guarded by the leader key's creation revision too.
The leader reads its key at every renewal: a key deleted or replaced by hand
(or by anyone who may write to etcd) ends its lead at once.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import grpc

from tensorflow_elastic.rendezvous import etcd

logger = logging.getLogger(__name__)

DEFAULT_TTL_S = 2
# A standby tries to take the key this often; the leader renews its lease more often still.
CAMPAIGN_INTERVAL_S = 0.1


class Election:
    """Campaigns for ``key`` in a thread; ``on_change()`` is called (from that thread or
    :meth:`step_down`'s caller) when this replica wins or loses the lead."""

    def __init__(self, client: etcd.EtcdClient, key: bytes, identity: str, ttl: int,
                 on_change: Callable[[], None]):
        if ttl < 1:
            raise ValueError("the leader lease TTL is a whole number of seconds >= 1")
        self._client = client
        self._key = key
        self.identity = identity
        self._ttl = ttl
        self._on_change = on_change
        self._lease = 0
        self._granted_ttl = ttl
        self._valid_until = 0.0
        # The leader key's creation revision while this replica leads; 0 otherwise.
        self.revision = 0
        # The replica that leads as far as this one knows ("" unknown).
        self.leader = ""
        # The replica that led before this one took the lead (None: none known).
        self.previous: str | None = None
        self.lost_cause = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tfelastic-election", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ends the campaign; a leader gives the key up at once (its lease is revoked)."""
        self._stop.set()
        self._thread.join()
        if self._lease:
            try:
                self._client.revoke(self._lease)
            except (etcd.EtcdUnavailable, grpc.RpcError) as e:
                logger.warning("could not revoke the leader lease (%s); it expires in %d s",
                               e, self._granted_ttl)

    @property
    def leading(self) -> bool:
        """Whether this replica may act as leader now (false once its local deadline passed)."""
        return self.revision != 0 and time.monotonic() < self._valid_until

    @property
    def margin(self) -> float:
        """How long before the lease can expire the leader stops acting."""
        return max(0.25, self._granted_ttl / 4)

    @property
    def _renew_every(self) -> float:
        return min(CAMPAIGN_INTERVAL_S, self._granted_ttl / 8)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._step()
            except etcd.EtcdUnavailable as e:
                self._lose_if_expired(f"etcd unreachable: {e}")
            except Exception as e:  # noqa: BLE001 - a bug must not leave a stale leader
                logger.exception("leader election failed")
                self.step_down(f"election error: {e}")
            self._stop.wait(self._renew_every if self.revision else CAMPAIGN_INTERVAL_S)

    def _step(self) -> None:
        sent = time.monotonic()
        if self._lease:
            ttl = self._client.keep_alive(self._lease)
            if ttl <= 0:
                self._lease = 0
                self.step_down("the leader lease expired at etcd")
                return
            self._valid_until = sent + ttl - self.margin
        if not self._lease:
            granted = self._client.grant(self._ttl)
            self._lease, self._granted_ttl = granted.ID, granted.TTL
            self._valid_until = sent + granted.TTL - self.margin
        if self.revision:
            key = self._client.get(self._key)
            if key is None or key.create_revision != self.revision:
                self.step_down("the leader key was deleted or replaced in etcd")
                return
            self._lose_if_expired("the lease could not be renewed in time")
            return
        response = self._client.txn(
            [etcd.created_at(self._key, 0)],
            [etcd.put(self._key, self.identity.encode(), self._lease)],
            [etcd.get(self._key)])
        if response.succeeded:
            self.previous = self.leader if self.leader and self.leader != self.identity else None
            self.leader = self.identity
            self.revision = response.header.revision
            logger.warning("this replica (%s) leads now", self.identity)
            self._on_change()
            return
        kvs = response.responses[0].response_range.kvs
        if kvs and kvs[0].lease == self._lease:
            # Still under this replica's own lease after it stepped down: let the key go.
            self._client.revoke(self._lease)
            self._lease = 0
        self.leader = kvs[0].value.decode() if kvs else self.leader

    def _lose_if_expired(self, cause: str) -> None:
        if self.revision and time.monotonic() >= self._valid_until:
            self.step_down(cause)

    def step_down(self, cause: str) -> None:
        """Stops leading now (e.g. a write found another leader); campaigns again."""
        if not self.revision:
            return
        self.revision = 0
        self.leader = ""
        self.lost_cause = cause
        logger.error("this replica (%s) stops leading: %s", self.identity, cause)
        self._on_change()
