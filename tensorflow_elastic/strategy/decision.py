"""What the elastic loop does about an error that ends a step or a state sync: a pure decision.

It reads the error (and, only when the error alone does not decide, asks
whether the job went on without this node's generation); the runtime
(runtime.py) does what it returns.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Callable

from tensorflow_elastic.errors import (ElasticJobFailed, GenerationEnded, MembershipChanged,
                                       StateLayoutMismatch)
from tensorflow_elastic.strategy.cluster import (is_another_groups_mismatch, is_mismatch,
                                                 is_recoverable)


class Action(enum.Enum):
    CHANGE = "change"          # the members voted at a commit: finish the step together, re-form
    RECOVER = "recover"        # a peer or the generation is gone: restore, re-form, sync
    RESYNC = "resync"          # a member was lost during the sync: re-form, nothing to restore
    LEAVE = "leave"            # this node's state does not fit the members': it leaves
    RAISE = "raise"            # not a membership matter: the error is the user's to see


@dataclasses.dataclass(frozen=True)
class Situation:
    """Where the error struck."""

    in_step: bool        # in the training function (False: in the state sync before it)
    newcomer: bool       # this node joined a running job
    commits: int         # the commits this node had made when it struck


def decide(error: BaseException, where: Situation, moved_on: Callable[[], bool]) -> Action:
    """What the elastic loop does about `error`.

    `moved_on()` asks the orchestrator whether the job went on without this
    node's generation (then a failed collective is a consequence of the change);
    it is asked only when the error alone does not decide.
    """
    if isinstance(error, ElasticJobFailed):
        return Action.RAISE  # the job cannot go on, for the reason it gives
    if isinstance(error, MembershipChanged):
        return Action.CHANGE
    if isinstance(error, StateLayoutMismatch):
        return Action.LEAVE
    if isinstance(error, GenerationEnded):
        return Action.RAISE if where.in_step else Action.RESYNC
    sync_mismatch = not where.in_step and is_mismatch(error)
    if sync_mismatch and where.newcomer and where.commits == 0:
        # Another newcomer's mismatch passed on by the source, or a generation that ended
        # meanwhile, may be the cause: then it re-forms (and fails alone next time if it is at
        # fault). Otherwise its transfer, in a group of its own with the source, failed: its
        # state does not fit the members'.
        if is_another_groups_mismatch(error) or moved_on():
            return Action.RECOVER
        return Action.LEAVE
    if (is_recoverable(error)
            # A newcomer's state broke the members' sync (at the start of a job, with no
            # commit yet, a differing state is a bug to fix instead).
            or (sync_mismatch and where.commits > 0)
            # A member outside a growth's sync that went on to its step: the source, aborted by
            # a differing newcomer, passed the abort on while this member resolved its step's
            # group with it.
            or is_another_groups_mismatch(error) or moved_on()):
        return Action.RECOVER
    return Action.RAISE
