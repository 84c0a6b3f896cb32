"""The agent's decision after a check of its workers, as a table (pure: no processes)."""

import pytest

from tensorflow_elastic.launch.decision import (NOT_RESTARTABLE, Action, Do, Scope, Situation,
                                                decide)
from tensorflow_elastic.launch.error_files import WorkerFailure
from tensorflow_elastic.launch.repeats import UserError

GROUP, WORKER = Scope.GROUP, Scope.WORKER
RUNNING = None


def fail(restarts: int, max_restarts: int) -> Action:
    return Action(Do.FAIL, reason=f"workers failed on this node after {restarts} restart(s) "
                                  f"(--max_restarts={max_restarts})")


CASES = [
    # (scope, exit codes, failed now, restarts, max_restarts, membership changed) -> actions
    ("all run", GROUP, (RUNNING, RUNNING), (), 0, 3, False, []),
    ("group: a failure restarts all", GROUP, (1, RUNNING), (0,), 0, 3, False,
     [Action(Do.RESTART_GROUP)]),
    ("group: two failures, one restart", GROUP, (1, -9), (0, 1), 1, 3, False,
     [Action(Do.RESTART_GROUP)]),
    ("group: restarts used up", GROUP, (1, RUNNING), (0,), 3, 3, False, [fail(3, 3)]),
    ("group: no restarts allowed", GROUP, (1,), (0,), 0, 0, False, [fail(0, 0)]),
    ("group: a failure after a success still restarts", GROUP, (0, 1), (1,), 0, 3, False,
     [Action(Do.RESTART_GROUP)]),
    ("group: membership change re-forms, uncounted", GROUP, (RUNNING, RUNNING), (), 3, 3, True,
     [Action(Do.REFORM_GROUP)]),
    ("group: no re-form once the job completed", GROUP, (0, RUNNING), (), 0, 3, True, []),
    ("group: all finished", GROUP, (0, 0), (), 2, 3, False, [Action(Do.FINISH)]),
    ("group: finished despite a change", GROUP, (0, 0), (), 0, 3, True, [Action(Do.FINISH)]),
    ("worker: the dead one comes back", WORKER, (RUNNING, 1), (1,), 0, 3, False,
     [Action(Do.RESTART_WORKER, 1)]),
    ("worker: restarts counted in order", WORKER, (1, 1, RUNNING), (0, 1), 2, 3, False,
     [Action(Do.RESTART_WORKER, 0), Action(Do.KEEP_DOWN, 1, "--max_restarts=3 used up")]),
    ("worker: not after the job completed", WORKER, (0, 1), (1,), 0, 3, False,
     [Action(Do.KEEP_DOWN, 1, "the job is complete"), Action(Do.FINISH)]),
    ("worker: not after the job completed, others run", WORKER, (0, 1, RUNNING), (1,), 0, 3,
     False, [Action(Do.KEEP_DOWN, 1, "the job is complete")]),
    ("worker: the last one down gives up", WORKER, (1, -9), (1,), 3, 3, False,
     [Action(Do.KEEP_DOWN, 1, "--max_restarts=3 used up"), fail(3, 3)]),
    ("worker: no restarts allowed", WORKER, (1,), (0,), 0, 0, False,
     [Action(Do.KEEP_DOWN, 0, "--max_restarts=0 used up"), fail(0, 0)]),
    ("worker: a restart keeps the node going", WORKER, (1, -9), (1,), 0, 1, False,
     [Action(Do.RESTART_WORKER, 1)]),
    ("worker: membership changes are the workers' own", WORKER, (RUNNING,), (), 0, 3, True, []),
    ("worker: all finished", WORKER, (0, 0, 1), (), 1, 3, False, [Action(Do.FINISH)]),
]
NOT_RESTARTED = "a restart cannot fix its error"
# (scope, exit codes, failed now, final) -> actions: errors a restart cannot fix (e.g. diverged)
FINAL_CASES = [
    ("group: fails at once, restarts left", GROUP, (1, RUNNING), (0,), (0,),
     [Action(Do.FAIL, reason=NOT_RESTARTABLE)]),
    ("worker: kept down, the others run on", WORKER, (1, RUNNING), (0,), (0,),
     [Action(Do.KEEP_DOWN, 0, NOT_RESTARTED)]),
    ("worker: the last one down ends the node", WORKER, (1, 1), (1,), (0, 1),
     [Action(Do.KEEP_DOWN, 1, NOT_RESTARTED), Action(Do.FAIL, reason=NOT_RESTARTABLE)]),
    ("worker: another failure still restarts", WORKER, (1, 1, RUNNING), (1,), (0,),
     [Action(Do.RESTART_WORKER, 1)]),
]


@pytest.mark.parametrize("scope, codes, failed, restarts, max_restarts, changed, expected",
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_decision(scope, codes, failed, restarts, max_restarts, changed, expected):
    seen = Situation(codes, failed, restarts, max_restarts, changed)
    assert decide(scope, seen) == expected


@pytest.mark.parametrize("scope, codes, failed, final, expected",
                         [case[1:] for case in FINAL_CASES], ids=[case[0] for case in FINAL_CASES])
def test_an_error_a_restart_cannot_fix_is_not_restarted(scope, codes, failed, final, expected):
    seen = Situation(codes, failed, restarts=0, max_restarts=3, final=final)
    assert decide(scope, seen) == expected


SETUP_ERROR = UserError(WorkerFailure(0, None, 10, 3, 0.0, "ValueError", "bad"),
                        "every worker failed the same way before the first step")
REFUSED = Action(Do.FAIL, reason="every worker failed the same way before the first step: not "
                                 "restarted, a restart would fail the same way", exit_code=3)

USER_ERROR_CASES = [
    # (scope, exit codes, failed, restarts, user error, awaiting others) -> actions
    ("group: a user error ends the job, restarts unspent", GROUP, (3, 3), (0, 1), 0,
     SETUP_ERROR, False, [REFUSED]),
    ("worker: a user error ends the job, restarts unspent", WORKER, (3, 3), (0, 1), 0,
     SETUP_ERROR, False, [REFUSED]),
    ("group: held while the others may fail so too", GROUP, (3, RUNNING), (0,), 0, None, True,
     [Action(Do.HOLD)]),
    ("worker: held while the others may fail so too", WORKER, (3, RUNNING), (0,), 0, None, True,
     [Action(Do.HOLD)]),
    ("group: a crash is restarted", GROUP, (1, RUNNING), (0,), 0, None, False,
     [Action(Do.RESTART_GROUP)]),
    ("worker: no user error once the job completed", WORKER, (0, 3), (1,), 0, SETUP_ERROR,
     False, [Action(Do.KEEP_DOWN, 1, "the job is complete"), Action(Do.FINISH)]),
    ("group: an old user error without a new failure decides nothing", GROUP,
     (RUNNING, RUNNING), (), 1, SETUP_ERROR, False, []),
]


@pytest.mark.parametrize("scope, codes, failed, restarts, error, awaiting, expected",
                         [case[1:] for case in USER_ERROR_CASES],
                         ids=[case[0] for case in USER_ERROR_CASES])
def test_user_errors_are_not_restarted(scope, codes, failed, restarts, error, awaiting,
                                       expected):
    seen = Situation(codes, failed, restarts, 3, user_error=error, awaiting_others=awaiting)
    assert decide(scope, seen) == expected


DIVERGED_ALIKE = UserError(WorkerFailure(0, None, 10, 1, 0.0, "TrainingDiverged", "inf"),
                           "every worker failed the same way before the first step")
# (scope, exit codes, failed, final, user error, awaiting others) -> actions: workers that
# diverged on the same parameters fail alike, yet their error, not a setup error, is the reason
FINAL_ALIKE_CASES = [
    ("worker: all failed alike, kept down for their error", WORKER, (1, 1, 1), (0, 1, 2),
     (0, 1, 2), DIVERGED_ALIKE, False,
     [Action(Do.KEEP_DOWN, slot, NOT_RESTARTED) for slot in range(3)]
     + [Action(Do.FAIL, reason=NOT_RESTARTABLE)]),
    ("group: all failed alike, the job ends for their error", GROUP, (1, 1), (0, 1), (0, 1),
     DIVERGED_ALIKE, False, [Action(Do.FAIL, reason=NOT_RESTARTABLE)]),
    ("worker: the first one down is kept down, not held", WORKER, (1, RUNNING), (0,), (0,), None,
     True, [Action(Do.KEEP_DOWN, 0, NOT_RESTARTED)]),
]


@pytest.mark.parametrize("scope, codes, failed, final, error, awaiting, expected",
                         [case[1:] for case in FINAL_ALIKE_CASES],
                         ids=[case[0] for case in FINAL_ALIKE_CASES])
def test_an_error_a_restart_cannot_fix_is_the_reason_even_when_all_failed_alike(
        scope, codes, failed, final, error, awaiting, expected):
    seen = Situation(codes, failed, restarts=0, max_restarts=3, final=final, user_error=error,
                     awaiting_others=awaiting)
    assert decide(scope, seen) == expected


# (exit codes, failed now, restarts, spares running, spare failures) -> actions; two spares
# wanted, max_restarts 3, a worker of the node is a member
SPARE_CASES = [
    ("spares are started up to the number wanted", (RUNNING, RUNNING), (), 0, 0, 0,
     [Action(Do.START_SPARE), Action(Do.START_SPARE)]),
    ("all wanted run: nothing to do", (RUNNING, RUNNING), (), 0, 2, 0, []),
    ("a spare takes the dead one's place, another starts", (RUNNING, -9), (1,), 0, 2, 0,
     [Action(Do.TAKE_SPARE, 1), Action(Do.START_SPARE)]),
    ("two dead, one spare: one takes a place, the other restarts", (-9, -9), (0, 1), 0, 1, 0,
     [Action(Do.TAKE_SPARE, 0), Action(Do.RESTART_WORKER, 1), Action(Do.START_SPARE),
      Action(Do.START_SPARE)]),
    ("a spare counts as a restart: none left, kept down", (RUNNING, -9), (1,), 3, 2, 0,
     [Action(Do.KEEP_DOWN, 1, "--max_restarts=3 used up")]),
    ("spares that keep failing are not started again", (RUNNING, RUNNING), (), 0, 0, 4, []),
    ("no spare once the job completed", (0, RUNNING), (), 0, 0, 0, []),
    ("no spare when the node gives up", (-9, -9), (0, 1), 3, 0, 0,
     [Action(Do.KEEP_DOWN, 0, "--max_restarts=3 used up"),
      Action(Do.KEEP_DOWN, 1, "--max_restarts=3 used up"),
      Action(Do.FAIL, None, "workers failed on this node after 3 restart(s) (--max_restarts=3)")]),
]


@pytest.mark.parametrize("codes, failed, restarts, spares, spare_failures, expected",
                         [case[1:] for case in SPARE_CASES], ids=[case[0] for case in SPARE_CASES])
def test_a_warm_spare_takes_a_dead_workers_place(codes, failed, restarts, spares,
                                                 spare_failures, expected):
    seen = Situation(codes, failed, restarts, max_restarts=3, spares=spares, spares_wanted=2,
                     job_running=True, spare_failures=spare_failures)
    assert decide(WORKER, seen) == expected


def test_no_spare_before_the_job_runs_here_nor_for_group_restarts():
    assert decide(WORKER, Situation((RUNNING,), spares_wanted=1)) == []
    assert decide(GROUP, Situation((RUNNING,), spares_wanted=1, job_running=True)) == []
