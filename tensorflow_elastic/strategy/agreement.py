"""How members agree, at the same commit, to re-form (a node waits to join, or one is leaving).

A blocking vote at every commit would cost a collective round trip per step.
Instead the vote of commit k is an all-reduce that runs in a background thread
while step k+1 computes, and its result is read at commit k+1: every member
sees the same sum, so all of them re-form at the same commit, one step after
the first vote. Votes use their own collective group key, so their instance
keys never interleave with those of the training step's collectives.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

import tensorflow as tf
from tensorflow.python.ops import collective_ops

from tensorflow_elastic.strategy import collectives

_VOTE_GROUP_OFFSET = collectives.KEYS_PER_GENERATION - 1
VOTE_TIMEOUT_S = 300.0


class CommitAgreement:
    """One vote per commit; `vote()` returns the outcome of the previous one."""

    def __init__(self, device: str):
        self._device = device
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tfe-vote")
        self._lock = threading.Lock()
        self._pending: Future | None = None
        self._group_key = 0
        self._group_size = 1
        self._instance_key = 0

    def regroup(self, generation: int, group_size: int) -> None:
        """Starts the votes of a new generation; an unfinished vote of the old one is dropped."""
        with self._lock:
            self._pending = None
            self._group_key = generation * collectives.KEYS_PER_GENERATION + _VOTE_GROUP_OFFSET
            self._group_size = group_size
            self._instance_key = 0

    def vote(self, wants_reform: bool) -> bool:
        """Casts this commit's vote; True on every member when someone voted to re-form last commit."""
        with self._lock:
            previous, self._pending = self._pending, None
        if previous is not None and previous.result() > 0:
            return True  # no new vote: this generation ends here on every member
        with self._lock:
            self._instance_key += 1
            self._pending = self._pool.submit(self._all_reduce, float(wants_reform),
                                              self._group_size, self._group_key,
                                              self._instance_key)
        return False

    def drain(self) -> None:
        """Waits for the last vote, so no member leaves a collective unanswered."""
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def _all_reduce(self, value: float, group_size: int, group_key: int, instance_key: int) -> float:
        with tf.device(self._device):
            total = collective_ops.all_reduce_v2(
                tf.constant(value), group_size=group_size, group_key=group_key,
                instance_key=instance_key, merge_op="Add", final_op="Id", timeout=VOTE_TIMEOUT_S)
        return float(total)
