"""Liveness: who went silent, and whose watch stream broke."""

from __future__ import annotations

import pytest

from tensorflow_elastic.rendezvous.liveness import (
    LOOP_TICK_S, BeatIntervals, LoopClock, Liveness, WatchLoss)


def test_liveness_expires_the_least_recently_heard_first():
    live = Liveness()
    for node_id, seen in ((1, 0.0), (2, 1.0), (3, 2.0)):
        live.touch(node_id, seen)
    live.touch(1, 3.0)
    assert live.oldest() == (2, 1.0)
    live.hold(3)
    assert live.expired(now=10.0, timeout=5.0) == [2, 1]
    assert live.silent_for(3, 10.0) == 0.0
    live.release(3, 10.0)
    assert live.expired(now=12.0, timeout=5.0) == [2, 1]


def test_the_longest_interval_asked_stays_until_every_node_asked_it_left():
    intervals = BeatIntervals()
    intervals.ask(1, 0.25)
    intervals.ask(2, 5.0)
    intervals.ask(3, 5.0)
    intervals.ask(4, 2.5)
    assert intervals.longest == 5.0
    intervals.forget(2)
    assert intervals.longest == 5.0  # node 3 still beats that slowly
    intervals.ask(3, 1.0)  # joined again after the run shrank: its beats still run at 5 s
    assert intervals.longest == 5.0
    intervals.forget(3)
    assert intervals.longest == 2.5
    intervals.ask(3, 1.0)  # back after it left: its beats start anew at 1 s
    intervals.forget(4)
    intervals.forget(99)  # never asked: nothing changes
    assert intervals.longest == 1.0
    intervals.forget(1)
    intervals.forget(3)
    assert intervals.longest == 0.0


def test_holds_taken_and_released_in_bulk_count_per_node():
    first = []
    live = Liveness(on_first=lambda: first.append(True))
    live.hold_all([1, 2, 2])  # node 2 held twice: by a join and by its reply
    assert live.oldest() is None
    live.release_all([1, 2], now=4.0)
    assert first == [True]  # the first node heard wakes the timer
    assert live.oldest() == (1, 4.0) and live.silent_for(2, 9.0) == 0.0  # 2 is still held
    live.release_all([2], now=6.0)
    assert live.expired(now=11.0, timeout=5.0) == [1]
    assert live.silent_for(2, 11.0) == 5.0


def test_intervals_asked_in_bulk_keep_each_nodes_longest():
    intervals = BeatIntervals()
    intervals.ask(1, 5.0)
    intervals.ask_all([1, 2, 3], 0.5)  # node 1 still beats at 5 s
    intervals.forget(1)
    assert intervals.longest == 0.5
    intervals.ask_all([2, 4], 2.5)
    intervals.forget(4)
    assert intervals.longest == 2.5  # node 2 was asked 2.5 s too
    intervals.forget(2)
    assert intervals.longest == 0.5
    intervals.forget(3)
    assert intervals.longest == 0.0


def test_watch_loss_reports_a_member_silent_for_the_grace_after_its_last_watch_broke():
    loss = WatchLoss(grace=2.0)
    for node_id in (1, 2, 3, 4):
        loss.opened(node_id)
    loss.opened(1)
    assert not loss.closed(1, 1.0, member=True)  # its second stream is still open
    assert loss.closed(1, 1.0, member=True)
    assert loss.closed(2, 1.0, member=True)
    assert not loss.closed(3, 1.0, member=False)
    assert loss.closed(4, 1.0, member=True)
    loss.opened(4)  # watching again: alive
    assert loss.deadlines() == [3.0, 3.0]
    loss.heard(2)  # a message since its watch broke: alive
    assert loss.overdue(2.9, members={1, 2, 3, 4}) == []
    assert loss.overdue(3.0, members={1, 2, 3, 4}) == [1]
    assert loss.deadlines() == []


def test_watch_loss_forgets_a_node_that_is_no_member_any_more():
    loss = WatchLoss(grace=2.0)
    loss.opened(1)
    assert loss.closed(1, 0.0, member=True)
    assert loss.overdue(5.0, members=set()) == []
    assert loss.deadlines() == []


def test_the_loop_clock_leaves_out_a_stall_of_the_loop_but_not_jitter():
    t = [100.0]
    clock = LoopClock(lambda: t[0])
    start = clock.now()
    t[0] += LOOP_TICK_S + 0.05  # a late tick: jitter, counted
    assert clock.now() == pytest.approx(start + LOOP_TICK_S + 0.05)
    t[0] += 10.0  # the loop stood still for 10 s (a frozen process, a long GC)
    after = clock.now()
    assert after - start == pytest.approx(2 * LOOP_TICK_S + 0.05)
    assert clock.stalled == pytest.approx(10.0 - LOOP_TICK_S)
    assert clock.to_monotonic(after) == pytest.approx(t[0])
    # A node heard just before the stall is as silent as the loop ran since.
    live = Liveness()
    live.touch(1, start)
    assert live.expired(after, 1.5) == []
