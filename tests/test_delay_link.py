"""The delay line of tools/delay_link.py: frames leave in order, each its delay after it came,
and a full queue drops what does not fit."""

from __future__ import annotations

import pytest

from tools.delay_link import DelayLine


def test_frames_leave_in_order_their_delay_after_they_came():
    line = DelayLine(0.2)
    line.push(10.0, b"a")
    line.push(10.1, b"bb")
    assert line.wait_s(10.1) == pytest.approx(0.1)
    assert line.due(10.19) == []
    assert line.due(10.2) == [b"a"]
    assert line.wait_s(10.2) == pytest.approx(0.1)
    assert line.due(11.0) == [b"bb"]
    assert line.wait_s(11.0) is None
    assert line.held == 0


def test_a_full_queue_drops_the_frame_that_does_not_fit_and_counts_it():
    line = DelayLine(1.0, capacity=5)
    assert line.push(0.0, b"abc")
    assert not line.push(0.0, b"def")
    assert line.push(0.0, b"gh")
    assert (line.held, line.dropped) == (5, 1)
    assert line.due(float("inf")) == [b"abc", b"gh"]  # all of it, at once


def test_no_delay_releases_at_once():
    line = DelayLine(0.0)
    line.push(3.0, b"x")
    assert line.wait_s(3.0) == 0.0
    assert line.due(3.0) == [b"x"]
