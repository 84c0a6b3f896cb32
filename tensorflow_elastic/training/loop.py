"""`tensorflow_elastic.run`: run a training function until it finishes, re-forming around failures.

What to do about an error is decided by `decide` (a pure function, tested as a
table); doing it is the runtime's (strategy/runtime.py).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import Callable, TypeVar

from tensorflow_elastic.errors import (ElasticJobFailed, GenerationEnded, MembershipChanged,
                                       StateLayoutMismatch)
from tensorflow_elastic.strategy import runtime as runtime_lib
from tensorflow_elastic.strategy.cluster import (is_another_groups_mismatch, is_mismatch,
                                                 is_recoverable)
from tensorflow_elastic.training.state import State

T = TypeVar("T")

# Re-forms in a row without a single commit in between: something is wrong
# beyond a lost peer (e.g. a bug that always fails the first step).
MAX_REFORMS_WITHOUT_PROGRESS = 5


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


def run(func: Callable[..., T]) -> Callable[..., T]:
    """Decorates `func(state, ...)`: sync, call, and on a fault restore, re-form, retry."""

    @functools.wraps(func)
    def wrapper(state: State, *args, **kwargs) -> T:
        rt = runtime_lib.current()
        newcomer = rt.session.standby
        move: Callable[[State], None] = rt.begin_training
        reforms_without_progress = 0
        while True:
            commits_before = state.commits
            in_step = False
            try:
                move(state)
                in_step = True
                result = func(state, *args, **kwargs)
            except Exception as error:  # noqa: BLE001 - decide() sorts it
                action = decide(error, Situation(in_step, newcomer, commits_before),
                                rt.session.moved_on)
                if action is Action.RAISE:
                    raise
                if action is Action.LEAVE:
                    raise rt.leave_mismatched(error) from error
                if action is Action.CHANGE:
                    move = rt.change
                elif action is Action.RESYNC:
                    move = rt.resume_after_lost_sync
                else:
                    # The steps finished since the last commit, plus the one in flight.
                    lost_steps = state.uncommitted_steps() + 1 if in_step else 0
                    move = functools.partial(rt.recover, error=error, lost_steps=lost_steps)
                if state.commits != commits_before:
                    reforms_without_progress = 0
                else:
                    reforms_without_progress += 1
                    if reforms_without_progress > MAX_REFORMS_WITHOUT_PROGRESS:
                        raise ElasticJobFailed(
                            f"{reforms_without_progress} re-forms in a row without a single "
                            f"commit; giving up (see the events file for the failures)") \
                            from error
            else:
                rt.finish(state)
                return result

    return wrapper
