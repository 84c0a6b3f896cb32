"""How members agree, at the same commit, to re-form (a node waits to join, or one is leaving).

A vote of its own at every commit would add a collective round trip to every
step (measured: about 40% on a 10 ms step with 3 local workers). Instead each
member's vote rides on the step's own all-reduce (its first one): two extra
elements, (do I want to re-form? 0 or 1, 1), read from a variable that each
commit sets, summed with the gradients and added to a running tally of
[votes, ballots]. Every member reads the same tally at the commit after the
step, so all of them re-form at the same commit and nobody rolls back. A step
without any all-reduce falls back to one explicit vote collective at the
commit.
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf
from tensorflow.python.ops import collective_ops

from tensorflow_elastic.ops.variable_snapshot import Float64Reader
from tensorflow_elastic.strategy import collectives

_FALLBACK_GROUP_OFFSET = collectives.KEYS_PER_GENERATION - 1
VOTE_TIMEOUT_S = 300.0


class ReformVote:
    """The vote carried by all-reduces, and its outcome at each commit."""

    def __init__(self, device: str, wants_reform: Callable[[], bool]):
        self._device = device
        self._wants_reform = wants_reform
        # Running sums [votes, ballots] of the all-reduces that carried a vote:
        # a step only adds to it (no read in the step), a commit reads it from
        # host memory (with the state's snapshot) and compares with the previous one.
        with tf.init_scope(), tf.device(f"{device}/device:CPU:0"):
            self.tally = tf.Variable([0.0, 0.0], dtype=tf.float64, trainable=False,
                                     name="reform_vote_tally")
            # This member's ballot for the steps until the next commit: set at
            # each commit, so a step call does no Python work for it.
            self._ballot = tf.Variable([0.0, 1.0], dtype=tf.float64, trainable=False,
                                       name="reform_vote_ballot")
        self._ballot_cast = 0.0
        self.read_tally = Float64Reader(self.tally)
        self._seen = (0.0, 0.0)
        self._group_key = 0
        self._group_size = 1
        self._instance_key = 0

    def regroup(self, generation: int, group_size: int) -> None:
        self._group_key = generation * collectives.KEYS_PER_GENERATION + _FALLBACK_GROUP_OFFSET
        self._group_size = group_size
        self._instance_key = 0
        self._seen = self.read_tally()
        self.cast_ballot()

    def cast_ballot(self) -> None:
        """Sets this member's ballot for the coming steps from what it wants now."""
        vote = 1.0 if self._wants_reform() else 0.0
        if vote != self._ballot_cast:
            self._ballot_cast = vote
            self._ballot.assign([vote, 1.0])

    def ballot(self, dtype: tf.DType) -> tf.Tensor:
        """(this member's vote: 0 or 1, 1) as a tensor of `dtype`, read when the step runs."""
        return tf.cast(self._ballot, dtype)

    def record(self, total: tf.Tensor) -> None:
        """Adds the summed ballots of one of the step's all-reduces to the tally."""
        with tf.device(self._device):
            self.tally.assign_add(tf.cast(total, tf.float64))

    def outcome(self, tally: tuple[float, ...]) -> bool:
        """At a commit: True on every member when any member voted to re-form since the last one.

        `tally` is the tally's value read at this commit.
        """
        votes, ballots = tally
        seen_votes, seen_ballots = self._seen
        self._seen = (votes, ballots)
        if ballots == seen_ballots:
            reform = self._explicit_vote() > 0
        else:
            reform = votes > seen_votes
        if not reform:
            self.cast_ballot()
        return reform

    def _explicit_vote(self) -> float:
        """For steps that made no all-reduce: one vote collective of its own."""
        self._instance_key += 1
        with tf.device(self._device):
            total = collective_ops.all_reduce_v2(
                tf.constant(1.0 if self._wants_reform() else 0.0), group_size=self._group_size,
                group_key=self._group_key, instance_key=self._instance_key, merge_op="Add",
                final_op="Id", timeout=VOTE_TIMEOUT_S)
        return float(total)
