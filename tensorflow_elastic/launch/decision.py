"""What the agent does after a check of its workers: a pure decision, apart from the doing.

The agent polls its workers, then asks :func:`decide` what follows from what
it saw (the slots' exit codes, which of them failed and wait for its
answer, its restart counter, whether the job's membership changed, whether
the failures are a user error a restart would repeat: launch/repeats.py, its
warm spares) and carries out the actions in order. The mode's
:class:`Scope` is the one thing that differs: a worker that re-forms in-process (or a parameter-server role) comes back alone, a
plain MWMS worker takes its whole group with it. A worker whose error says
a restart cannot help (e.g. the training diverged) is never restarted, and the job's end
says so, even when every worker failed alike. A worker
that comes back alone comes back as a warm spare when one runs (``--spares``):
the spare joins at once, and a new spare is started in its place.
"""

from __future__ import annotations

import dataclasses
import enum

from tensorflow_elastic.launch.repeats import UserError


class Scope(enum.Enum):
    """What a failure restarts."""

    WORKER = "worker"  # the dead worker alone; the others go on (in-process, PS roles)
    GROUP = "group"    # every local worker, after a new rendezvous (restart-based MWMS)


class Do(enum.Enum):
    RESTART_WORKER = "restart_worker"  # start the slot again (counts as a restart)
    TAKE_SPARE = "take_spare"          # a warm spare takes the slot and joins (counts as one)
    START_SPARE = "start_spare"        # start one more spare, which warms up and waits
    KEEP_DOWN = "keep_down"            # leave the dead slot down, saying why
    RESTART_GROUP = "restart_group"    # a worker failed: re-form and start all (counts)
    REFORM_GROUP = "reform_group"      # the membership changed: re-form and start all
    HOLD = "hold"                      # failed slots wait for the others (see Situation)
    FINISH = "finish"                  # the job completed
    FAIL = "fail"                      # give up, saying why, with exit_code


@dataclasses.dataclass(frozen=True)
class Action:
    do: Do
    slot: int | None = None
    reason: str = ""
    exit_code: int = 1


@dataclasses.dataclass(frozen=True)
class Situation:
    """What one check saw: each slot's exit code (None: running), the failed slots not yet
    acted on, and the agent's counters.

    ``user_error``: the failures are ones a restart would repeat. ``awaiting_others``: the
    failed slots failed the same way before the first step while others still run, which
    may yet fail so too; they are held a while instead of restarted.
    """

    exit_codes: tuple[int | None, ...]
    failed: tuple[int, ...] = ()
    restarts: int = 0
    max_restarts: int = 0
    membership_changed: bool = False
    # Slots whose worker failed with an error a restart cannot fix (e.g. training diverged).
    final: tuple[int, ...] = ()
    user_error: UserError | None = None
    awaiting_others: bool = False
    # Warm spares running, how many the launcher keeps (--spares) once ``job_running`` (a
    # worker of this node is a member), and how many spares failed before they were needed
    # (more than max_restarts: no new ones, the script cannot run as a spare).
    spares: int = 0
    spares_wanted: int = 0
    job_running: bool = False
    spare_failures: int = 0


NOT_RESTARTABLE = "a worker failed in a way a restart cannot fix"


def decide(scope: Scope, seen: Situation) -> list[Action]:
    """The actions, in order; none while every worker runs and nothing changed."""
    succeeded = any(code == 0 for code in seen.exit_codes)
    # A worker's own word that a restart cannot fix its error outranks the guess that failures
    # alike are a setup error: workers that diverged on the same parameters fail alike too.
    cannot_fix = bool(set(seen.failed) & set(seen.final))
    if seen.failed and not succeeded and not cannot_fix:
        if seen.user_error is not None:
            return [Action(Do.FAIL, reason=f"{seen.user_error.why}: not restarted, a restart "
                                           f"would fail the same way",
                           exit_code=seen.user_error.exit_code)]
        if seen.awaiting_others:
            return [Action(Do.HOLD)]
    if scope is Scope.GROUP:
        if seen.failed:
            if cannot_fix:
                return [Action(Do.FAIL, reason=NOT_RESTARTABLE)]
            if seen.restarts >= seen.max_restarts:
                return [_give_up(seen.restarts, seen.max_restarts)]
            return [Action(Do.RESTART_GROUP)]
        if seen.membership_changed and not succeeded:
            return [Action(Do.REFORM_GROUP)]
        return _ending(seen.exit_codes, seen.restarts, seen.max_restarts)
    actions, codes, restarts, spares = [], list(seen.exit_codes), seen.restarts, seen.spares
    for slot in seen.failed:
        if succeeded:
            actions.append(Action(Do.KEEP_DOWN, slot, "the job is complete"))
        elif slot in seen.final:
            actions.append(Action(Do.KEEP_DOWN, slot, "a restart cannot fix its error"))
        elif restarts >= seen.max_restarts:
            actions.append(Action(Do.KEEP_DOWN, slot,
                                  f"--max_restarts={seen.max_restarts} used up"))
        else:
            restarts += 1
            codes[slot] = None
            actions.append(Action(Do.TAKE_SPARE if spares else Do.RESTART_WORKER, slot))
            spares -= bool(spares)
    ending = _ending(codes, restarts, seen.max_restarts, bool(seen.final))
    if (seen.job_running and not succeeded and not ending
            and seen.spare_failures <= seen.max_restarts):
        actions += [Action(Do.START_SPARE)] * max(0, seen.spares_wanted - spares)
    return actions + ending


def _ending(exit_codes: list[int | None] | tuple[int | None, ...], restarts: int,
            max_restarts: int, final: bool = False) -> list[Action]:
    """Once every worker has exited: finished if one of them completed the job."""
    if any(code is None for code in exit_codes):
        return []
    if any(code == 0 for code in exit_codes):
        return [Action(Do.FINISH)]
    if final:
        return [Action(Do.FAIL, reason=NOT_RESTARTABLE)]
    return [_give_up(restarts, max_restarts)]


def _give_up(restarts: int, max_restarts: int) -> Action:
    return Action(Do.FAIL, reason=f"workers failed on this node after {restarts} restart(s) "
                                  f"(--max_restarts={max_restarts})")
