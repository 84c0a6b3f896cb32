"""`tensorflow_elastic.run`: run a training function until it finishes, re-forming around failures."""

from __future__ import annotations

import functools
import logging
from typing import Callable, TypeVar

from tensorflow_elastic.errors import ElasticJobFailed, GenerationEnded, MembershipChanged
from tensorflow_elastic.observability import events
from tensorflow_elastic.strategy import runtime as runtime_lib
from tensorflow_elastic.strategy.cluster import is_recoverable
from tensorflow_elastic.training.state import State

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Re-forms in a row without a single commit in between: something is wrong
# beyond a lost peer (e.g. a bug that always fails the first step).
MAX_REFORMS_WITHOUT_PROGRESS = 5


def run(func: Callable[..., T]) -> Callable[..., T]:
    """Decorates `func(state, ...)`: sync, call, and on a fault restore, re-form, retry."""

    @functools.wraps(func)
    def wrapper(state: State, *args, **kwargs) -> T:
        rt = runtime_lib.current()
        session = rt.session
        session.enter_training()
        reforms_without_progress = 0
        while True:
            commits_before = state.commits
            in_step = False
            try:
                state.sync()
                in_step = True
                result = func(state, *args, **kwargs)
            except MembershipChanged:
                session.finish_step_together()
                if session.leave_requested:
                    session.leave("leave requested")
                    raise SystemExit(0)
            except GenerationEnded:
                if in_step:
                    raise
                # A member was lost while the others gathered to sync: nothing ran yet.
                logger.warning("generation %d ended during the state sync; re-forming",
                               session.generation)
            except Exception as error:  # noqa: BLE001 - filtered just below
                if not is_recoverable(error):
                    raise
                session.check_job_alive()
                logger.warning("collective failed (%s); re-forming", type(error).__name__)
                rt.report_failure(error)
                # The steps finished since the last commit, plus the one in flight.
                lost_steps = state.uncommitted_steps() + 1 if in_step else 0
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
                        f"giving up (see the events file for the failures)")
            else:
                reforms_without_progress = 0
            session.reform()
            state.on_reset()

    return wrapper
