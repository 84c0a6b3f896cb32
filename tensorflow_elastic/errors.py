"""Exceptions the elastic runtime raises to training code."""

from __future__ import annotations


class MembershipChanged(Exception):
    """Raised at a commit boundary on every member at once: the group re-forms (growth or a leave)."""


class GenerationEnded(Exception):
    """A member was lost while the others gathered (e.g. for the state sync): re-form and retry."""


class ElasticJobFailed(RuntimeError):
    """The job cannot go on (e.g. fewer than min_nodes for too long); the message says why."""


class NoCommittedState(ElasticJobFailed):
    """Every member furthest ahead ran steps past its last commit and wrote variables the
    commit does not hold: nobody can give the job its last commit back."""


class StateLayoutMismatch(RuntimeError):
    """This node's state variables differ from the members' (names, shapes or dtypes): it cannot
    take their state, so it leaves; the members re-form without it."""


class TrainingDiverged(RuntimeError):
    """The loss or a gradient became NaN or Inf: the job ends, and the message says where and
    what to change. A restart would only diverge again, so the launcher does not restart it."""

    restartable = False
