"""A spare's wait for its agent's word (membership/spare.py), on a real pipe."""

import os
import threading
import time

from tensorflow_elastic.membership.spare import NEEDED, Spare


def test_the_agents_byte_says_needed():
    read_end, write_end = os.pipe()
    os.write(write_end, NEEDED)
    assert Spare(read_end).wait_until_needed(lambda: False) is True
    os.close(write_end)


def test_the_end_of_the_pipe_says_not_needed():
    read_end, write_end = os.pipe()
    threading.Timer(0.1, os.close, (write_end,)).start()
    assert Spare(read_end).wait_until_needed(lambda: False) is False


def test_giving_up_ends_the_wait_within_a_poll():
    read_end, write_end = os.pipe()
    asked = time.monotonic() + 0.2
    started = time.monotonic()
    assert Spare(read_end).wait_until_needed(lambda: time.monotonic() > asked) is False
    assert time.monotonic() - started < 1.0
    os.close(write_end)


def test_a_spare_comes_from_the_environment_once(monkeypatch):
    monkeypatch.setenv("TFE_SPARE_FD", "7")
    assert Spare.from_environment() is not None
    assert "TFE_SPARE_FD" not in os.environ
    assert Spare.from_environment() is None
