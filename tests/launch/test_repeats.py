"""Which failures a restart would only repeat (pure: failures as the agent collects them)."""

import pytest

from tensorflow_elastic.launch.error_files import WorkerFailure
from tensorflow_elastic.launch.repeats import (WAIT_FOR_OTHERS_S, signature, user_error,
                                               waits_for_others)

RUNNING = None
TRACE = 'Traceback:\n  File "train.py", line 3\nValueError: lr < 0\n'


def failure(rank, error="ValueError", message="lr < 0", code=1, time=100.0, step=None,
            tail=()):
    return WorkerFailure(rank, None, 1000 + rank, code, time, error, message,
                         TRACE if error else "", list(tail), step=step)


def test_a_signal_or_a_lost_peer_has_no_signature():
    assert signature(failure(0, code=-9, error="")) is None
    assert signature(failure(0, error="UnavailableError", message="peer gone")) is None
    assert signature(failure(0, error="ConnectionResetError")) is None
    assert signature(failure(0)) == signature(failure(1, time=5.0))  # rank, pid, time aside


def test_without_an_error_file_the_exit_code_and_last_line_sign():
    usage = failure(0, error="", message="", code=2, tail=["usage: x", "x: error: --data", ""])
    assert signature(usage) == (2, "", "x: error: --data", "")
    assert signature(usage) != signature(failure(1, error="", code=2, tail=["other"]))


def test_the_task_in_tensorflow_device_names_does_not_sign():
    def failing_op(rank, task, file="a.tfrecord"):
        return failure(rank, error="DataLossError", message=(
            f"{{{{function_node __wrapped__TFRecordIndex_device_/job:worker/replica:0/task:{task}"
            f"/device:CPU:0}}}} TFRecord file {file}: truncated file [Op:TFRecordIndex]"))

    assert signature(failing_op(0, 4)) == signature(failing_op(1, 5))
    assert signature(failing_op(0, 4)) != signature(failing_op(1, 5, file="b.tfrecord"))
    assert user_error((1, 1), [failing_op(0, 4), failing_op(1, 5)]) is not None


CASES = [
    # (exit codes, failures oldest first) -> the user error's worker and why, or None
    ("every worker the same before the first step", (1, 1), [failure(0), failure(1)],
     (0, "every worker failed the same way")),
    ("one worker alone proves nothing", (1,), [failure(0)], None),
    ("one worker, twice the same", (1,), [failure(0, time=1), failure(0, time=9)],
     (0, "worker 0 failed again exactly as before")),
    ("the others still run", (1, RUNNING), [failure(0)], None),
    ("different errors", (1, 1), [failure(0), failure(1, message="other")], None),
    ("after the first step", (1, 1), [failure(0, step=5), failure(1, step=5)], None),
    ("killed by signals", (-9, -9), [failure(0, code=-9, error=""), failure(1, code=-9, error="")],
     None),
    ("a lost peer everywhere", (1, 1),
     [failure(0, error="AbortedError"), failure(1, error="AbortedError")], None),
    ("a restarted worker fails as before", (1, RUNNING),
     [failure(0, time=1), failure(0, time=20)], (0, "worker 0 failed again exactly as before")),
    ("as before, but steps were made in between", (1, RUNNING),
     [failure(0, step=3), failure(0, step=9)], None),
    ("as before, at the same step", (1, RUNNING),
     [failure(0, step=3), failure(0, step=3)], (0, "worker 0 failed again")),
    ("another worker's earlier failure is no repeat", (RUNNING, 1),
     [failure(0), failure(1)], None),
    ("a different failure after a restart", (1, RUNNING),
     [failure(0), failure(0, message="other")], None),
]


@pytest.mark.parametrize("codes, failures, expected", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_user_error(codes, failures, expected):
    found = user_error(codes, failures)
    if expected is None:
        assert found is None
    else:
        assert found.failure.local_rank == expected[0] and found.why.startswith(expected[1])
        assert found.exit_code == 1


@pytest.mark.parametrize("codes, pending, now, waits", [
    ((1, RUNNING), [failure(0)], 101.0, True),
    ((1, RUNNING), [failure(0)], 100.0 + WAIT_FOR_OTHERS_S, False),  # waited long enough
    ((1, RUNNING), [failure(0, step=2)], 101.0, False),               # training had begun
    ((1, 1, RUNNING), [failure(0), failure(1, message="x")], 101.0, False),  # not the same
    ((-9, RUNNING), [failure(0, code=-9, error="")], 101.0, False),    # a crash
    ((1, 0), [failure(0)], 101.0, False),                              # the job completed
    ((1, 1), [failure(0), failure(1)], 101.0, False),                  # nobody left to wait for
    ((RUNNING, RUNNING), [], 101.0, False),
])
def test_waits_for_others(codes, pending, now, waits):
    assert waits_for_others(codes, pending, now) is waits
