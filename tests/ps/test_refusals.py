"""Refused calls: every one counted, logged at most once per reason per interval."""

import logging

from tensorflow_elastic.ps.refusals import Refusals


def test_each_reason_is_logged_once_per_interval_with_the_count_since_its_last_line(caplog):
    now = [0.0]
    refusals = Refusals(log_interval=10.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="tensorflow_elastic.ps.refusals")
    for _ in range(5):
        refusals.record("unauthenticated", "no token")
    refusals.record("non_finite", "NaN in w")
    now[0] = 11.0
    refusals.record("unauthenticated", "no token")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert lines[0].startswith("refused 1 call(s) (unauthenticated)")
    assert lines[1].startswith("refused 1 call(s) (non_finite)")
    assert lines[2].startswith("refused 5 call(s) (unauthenticated)")  # 4 quiet ones + this
    assert refusals.counts() == {"unauthenticated": 6, "non_finite": 1}
