"""`tensorflow_elastic.run`: run a training function until it finishes, re-forming around failures."""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from typing import Callable, TypeVar

from tensorflow_elastic.errors import (ElasticJobFailed, GenerationEnded, MembershipChanged,
                                       StateLayoutMismatch)
from tensorflow_elastic.observability import events
from tensorflow_elastic.strategy import runtime as runtime_lib
from tensorflow_elastic.strategy.cluster import (is_another_groups_mismatch, is_mismatch,
                                                 is_recoverable)
from tensorflow_elastic.training.state import State

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Re-forms in a row without a single commit in between: something is wrong
# beyond a lost peer (e.g. a bug that always fails the first step).
MAX_REFORMS_WITHOUT_PROGRESS = 5


@dataclasses.dataclass
class _Change:
    """A membership change in progress, for the one line the new chief prints when it is over."""

    started: float
    members: frozenset[int]
    cause: str = ""
    lost_steps: int | None = None

    @classmethod
    def failure(cls, ongoing: "_Change | None", session, cause: str, lost_steps: int) -> "_Change":
        """A failure, possibly during a change already under way (which keeps its start)."""
        if ongoing is None:
            return cls(time.monotonic(), frozenset(session.membership.members), cause, lost_steps)
        return cls(ongoing.started, ongoing.members, cause, (ongoing.lost_steps or 0) + lost_steps)

    def describe(self, session) -> str:
        membership = session.membership
        now = frozenset(membership.members)
        parts = []
        if self.members - now:
            parts.append(f"node(s) {sorted(self.members - now)} "
                         + (f"lost ({self.cause})" if self.cause else "left"))
        if now - self.members:
            parts.append(f"node(s) {sorted(now - self.members)} joined")
        what = ", ".join(parts) or (f"re-formed after {self.cause}" if self.cause else "re-formed")
        took = f"recovered in {time.monotonic() - self.started:.2f} s" if self.cause \
            else f"paused {time.monotonic() - self.started:.2f} s"
        lost = "" if self.lost_steps is None else f", {self.lost_steps} step(s) lost"
        return (f"generation {membership.generation}: {what}; {membership.world_size} member(s); "
                f"{took}{lost}")


def run(func: Callable[..., T]) -> Callable[..., T]:
    """Decorates `func(state, ...)`: sync, call, and on a fault restore, re-form, retry."""

    @functools.wraps(func)
    def wrapper(state: State, *args, **kwargs) -> T:
        rt = runtime_lib.current()
        session = rt.session
        # A node joining a running job (rather than one of those that started it).
        newcomer = session.standby
        if newcomer:
            state.prepare_to_join()
        session.enter_training()
        reforms_without_progress = 0
        change: _Change | None = None
        last_failure: BaseException | None = None
        while True:
            commits_before = state.commits
            in_step = False
            try:
                state.sync()
                if change is not None and session.node_id == session.membership.chief_id:
                    # One line per change, from the new chief; TensorFlow's own lines about
                    # the aborted collectives stay in the workers' log files.
                    logger.warning("%s", change.describe(session))
                change = None
                in_step = True
                result = func(state, *args, **kwargs)
            except MembershipChanged:
                change = _Change(time.monotonic(), frozenset(session.membership.members))
                session.finish_step_together()
                if session.leave_requested:
                    session.leave("leave requested")
                    raise SystemExit(0)
            except StateLayoutMismatch as error:
                # Leaving at once lets the members re-form without this node.
                session.leave(f"state layout differs: {error}")
                raise
            except GenerationEnded:
                if in_step:
                    raise
                # A member was lost while the others gathered to sync: nothing ran yet.
                logger.info("generation %d ended during the state sync; re-forming",
                            session.generation)
                change = _Change.failure(change, session, "a member lost during the state sync", 0)
            except Exception as error:  # noqa: BLE001 - filtered just below
                sync_mismatch = not in_step and is_mismatch(error)
                if sync_mismatch and newcomer and commits_before == 0:
                    # Another newcomer's mismatch passed on by the source, or a generation that
                    # ended meanwhile, may be the cause: then it re-forms (and fails alone next
                    # time if it is at fault).
                    if not is_another_groups_mismatch(error) and not session.moved_on():
                        # A newcomer whose state does not fit the members' (its transfer, in a
                        # group of its own with the source, failed): it leaves, they re-form
                        # without it (below, on their side). The orchestrator keeps short
                        # reasons; the error itself says it all.
                        session.leave(f"state sync failed: {str(error).splitlines()[0][:200]}")
                        raise StateLayoutMismatch(
                            f"this node's state could not be synced from the members' ({error}): "
                            f"build the same model, optimizer and inputs on every node before "
                            f"training") from error
                elif not (is_recoverable(error) or session.moved_on()
                          or (sync_mismatch and commits_before > 0)
                          # A member outside a growth's sync that went on to its step: the
                          # source, aborted by a differing newcomer, passed the abort on
                          # while this member resolved its step's group with it.
                          or is_another_groups_mismatch(error)):
                    raise
                session.check_job_alive()
                logger.info("collective failed (%s); re-forming", type(error).__name__)
                # The steps finished since the last commit, plus the one in flight.
                lost_steps = state.uncommitted_steps() + 1 if in_step else 0
                change = _Change.failure(change, session, type(error).__name__, lost_steps)
                last_failure = error
                rt.report_failure(error)
                state.restore()
                session.events.record(events.STATE_RESTORED, node=session.node_id,
                                      generation=session.generation, step=state.commits,
                                      lost_steps=lost_steps)
            else:
                session.finish(state.commits)
                return result
            if state.commits == commits_before:
                reforms_without_progress += 1
                if reforms_without_progress > MAX_REFORMS_WITHOUT_PROGRESS:
                    raise ElasticJobFailed(
                        f"{reforms_without_progress} re-forms in a row without a single commit; "
                        f"giving up (see the events file for the failures)") from last_failure
            else:
                reforms_without_progress = 0
            session.reform()
            state.on_reset()

    return wrapper
