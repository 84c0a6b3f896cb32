"""How members agree, at the same commit, to re-form (a node waits to join, or one is leaving).

A vote of its own at every commit would add a collective round trip to every
step (measured: about 40% on a 10 ms step with 3 local workers). Instead each
member's vote rides on the step's own all-reduce: one extra element, fed at
call time with "do I want to re-form?", summed with the gradients. Every
member reads the same sum at the commit after the step, so all of them
re-form at the same commit and nobody rolls back. A step without any
all-reduce falls back to one explicit vote collective at the commit.
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf
from tensorflow.python.ops import collective_ops

from tensorflow_elastic.strategy import collectives

_FALLBACK_GROUP_OFFSET = collectives.KEYS_PER_GENERATION - 1
VOTE_TIMEOUT_S = 300.0


class ReformVote:
    """The vote carried by all-reduces, and its outcome at each commit."""

    def __init__(self, device: str, wants_reform: Callable[[], bool]):
        self._device = device
        self._wants_reform = wants_reform
        # [sum of the last carried vote, number of all-reduces that carried one]:
        # one variable, so a commit reads it with a single copy.
        with tf.init_scope(), tf.device(device):
            self._tally = tf.Variable([0.0, 0.0], dtype=tf.float64, trainable=False,
                                      name="reform_vote_tally")
        self._carried_at_last_commit = 0.0
        self._group_key = 0
        self._group_size = 1
        self._instance_key = 0

    def regroup(self, generation: int, group_size: int) -> None:
        self._group_key = generation * collectives.KEYS_PER_GENERATION + _FALLBACK_GROUP_OFFSET
        self._group_size = group_size
        self._instance_key = 0
        self._carried_at_last_commit = float(self._tally.numpy()[1])

    def ballot(self, dtype: tf.DType) -> tf.Tensor:
        """This member's vote (0 or 1) as a tensor of `dtype`, read when the step is called."""
        vote = collectives.call_time_int(
            (id(self), "vote"), lambda: 1 if self._wants_reform() else 0)
        return tf.cast(vote, dtype)

    def record(self, total: tf.Tensor) -> None:
        """Keeps the summed votes of the step's all-reduce for the next commit."""
        with tf.device(self._device):
            self._tally.assign(tf.stack([tf.cast(total, tf.float64), self._tally[1] + 1.0]))

    def outcome(self) -> bool:
        """At a commit: True on every member when any member voted to re-form during the step."""
        total, carried = self._tally.numpy()
        if carried == self._carried_at_last_commit:
            total = self._explicit_vote()
        self._carried_at_last_commit = carried
        return total > 0

    def _explicit_vote(self) -> float:
        """For steps that made no all-reduce: one vote collective of its own."""
        self._instance_key += 1
        with tf.device(self._device):
            total = collective_ops.all_reduce_v2(
                tf.constant(1.0 if self._wants_reform() else 0.0), group_size=self._group_size,
                group_key=self._group_key, instance_key=self._instance_key, merge_op="Add",
                final_op="Id", timeout=VOTE_TIMEOUT_S)
        return float(total)
