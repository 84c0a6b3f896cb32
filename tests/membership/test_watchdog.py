"""The progress watchdog: a member stuck outside TensorFlow steps aside at the timeout; one that
waits inside TensorFlow aborts its collectives only after twice the timeout; nothing happens
before the first commit or while re-forming."""

from __future__ import annotations

import os
import sys
import time
import traceback
import types

import pytest

from tensorflow_elastic.membership import watchdog as watchdog_lib
from tensorflow_elastic.membership.watchdog import ProgressWatchdog, in_tensorflow


def _stack(path: str) -> traceback.StackSummary:
    return traceback.StackSummary.from_list([("train.py", 10, "<module>", ""), (path, 1, "op", "")])


@pytest.fixture
def fake_tensorflow(monkeypatch, tmp_path):
    """A `tensorflow` module living in tmp_path/tensorflow; returns the path of one of its files."""
    package = tmp_path / "tensorflow"
    monkeypatch.setitem(sys.modules, "tensorflow",
                        types.SimpleNamespace(__file__=str(package / "__init__.py")))
    return os.path.join(str(package), "python", "eager", "execute.py")


def _watchdog(timeout=10.0, paused=lambda: False):
    calls = []
    dog = ProgressWatchdog(timeout, lambda r: calls.append(("stuck", r)),
                           lambda r: calls.append(("stalled", r)), paused)
    return dog, calls


def test_stuck_outside_tensorflow_steps_aside_once_with_the_main_thread_s_stack(monkeypatch):
    dog, calls = _watchdog()
    now = time.monotonic()
    dog.check(now + 100)
    assert calls == []  # not armed before the first commit
    dog.progress()
    dog.check(time.monotonic() + 5)
    assert calls == []
    dog.check(time.monotonic() + 11)  # called from the main thread: it is not in TensorFlow
    assert [kind for kind, _ in calls] == ["stuck"]
    assert "no commit for 11 s" in calls[0][1] and "test_watchdog.py" in calls[0][1]
    dog.check(time.monotonic() + 12)
    assert len(calls) == 1  # the clock restarted when it acted


def test_waiting_in_tensorflow_aborts_only_after_twice_the_timeout(monkeypatch, fake_tensorflow):
    monkeypatch.setattr(watchdog_lib, "main_thread_stack", lambda: _stack(fake_tensorflow))
    dog, calls = _watchdog()
    dog.progress()
    dog.check(time.monotonic() + 15)
    assert calls == []  # a peer stuck in Python gets the time to step aside first
    dog.check(time.monotonic() + 21)
    assert [kind for kind, _ in calls] == ["stalled"]


def test_a_member_that_commits_has_no_stack_taken(monkeypatch):
    taken = []
    monkeypatch.setattr(watchdog_lib, "main_thread_stack", lambda: taken.append(1))
    dog, calls = _watchdog()
    dog.progress()
    dog.check(time.monotonic() + 5)
    assert taken == [] and calls == []


def test_no_action_while_re_forming_and_a_re_form_restarts_the_clock():
    reforming = [True]
    dog, calls = _watchdog(paused=lambda: reforming[0])
    dog.progress()
    dog.check(time.monotonic() + 100)
    assert calls == []
    reforming[0] = False
    dog.restart()
    dog.check(time.monotonic() + 5)
    assert calls == []


def test_in_tensorflow_looks_at_the_innermost_frame(fake_tensorflow):
    assert in_tensorflow(_stack(fake_tensorflow))
    assert not in_tensorflow(_stack("/elsewhere/train.py"))


def test_the_thread_runs_checks_and_stops():
    dog, calls = _watchdog(timeout=0.2)
    dog.start()
    dog.progress()
    deadline = time.monotonic() + 10
    while not calls and time.monotonic() < deadline:
        time.sleep(0.02)
    dog.stop()
    assert calls and calls[0][0] == "stuck"  # the main thread sleeps here, outside TensorFlow


def test_a_timeout_that_is_not_positive_is_refused():
    with pytest.raises(ValueError, match="must be positive"):
        ProgressWatchdog(0, print, print)


def test_a_slow_step_in_tensorflow_asks_for_a_peer_check_every_slow_after(monkeypatch,
                                                                          fake_tensorflow):
    monkeypatch.setattr(watchdog_lib, "main_thread_stack", lambda: _stack(fake_tensorflow))
    slow = []
    dog = ProgressWatchdog(100.0, lambda r: None, lambda r: None, on_slow=slow.append,
                           slow_after=5.0)
    dog.progress()
    start = time.monotonic()
    dog.check(start + 4)
    assert slow == []
    dog.check(start + 6)
    dog.check(start + 7)
    assert len(slow) == 1 and "no commit for 6 s" in slow[0]
    dog.check(start + 12)
    assert len(slow) == 2  # again while the stall lasts
    dog.progress()  # a commit: a new stall starts its own count
    dog.check(time.monotonic() + 3)
    assert len(slow) == 2


def test_a_slow_step_outside_tensorflow_asks_for_no_peer_check():
    slow = []
    dog = ProgressWatchdog(100.0, lambda r: None, lambda r: None, on_slow=slow.append,
                           slow_after=5.0)
    dog.progress()
    dog.check(time.monotonic() + 6)  # called from the main thread: it is not in TensorFlow
    assert slow == []
