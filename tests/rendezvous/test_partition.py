"""Who leaves a partition: pairs count once reported from both ends; the fewest members that
cover every pair leave, the one in most pairs first, then the highest id; reports of an older
generation count no more. A partition's leaver is blocked at once, its cooldown doubling."""

from __future__ import annotations

import pytest

from tensorflow_elastic.rendezvous import BlocklistedError
from tensorflow_elastic.rendezvous.blocklist import Blocklist
from tensorflow_elastic.rendezvous.partition import PartitionReports, who_leaves


def _reports(generation: int, *pairs: tuple[int, int]) -> PartitionReports:
    reports = PartitionReports()
    for reporter, peer in pairs:
        reports.add(generation, reporter, [peer])
    return reports


def test_one_sided_report_removes_nobody():
    assert who_leaves(_reports(3, (1, 2)), 3, {0, 1, 2}) == []


def test_a_mutual_pair_loses_its_higher_id():
    assert who_leaves(_reports(3, (1, 2), (2, 1)), 3, {0, 1, 2}) == [2]
    assert who_leaves(_reports(3, (0, 2), (2, 0)), 3, {0, 1, 2}) == [2]  # the chief stays


def test_the_member_in_most_pairs_leaves_alone():
    reports = _reports(5, (0, 3), (3, 0), (1, 3), (3, 1), (2, 3), (3, 2))
    assert who_leaves(reports, 5, {0, 1, 2, 3}) == [3]
    # Two disjoint pairs: one leaver each.
    assert who_leaves(_reports(5, (0, 1), (1, 0), (2, 3), (3, 2)), 5, {0, 1, 2, 3}) == [1, 3]


def test_older_generations_and_non_members_count_no_more():
    reports = _reports(3, (1, 2))
    reports.add(4, 2, [1])  # a newer generation: the older report is dropped
    assert who_leaves(reports, 4, {0, 1, 2}) == []
    reports.add(3, 1, [2])  # late, from the ended generation: ignored
    assert who_leaves(reports, 4, {0, 1, 2}) == []
    reports.add(4, 1, [2])
    assert who_leaves(reports, 4, {0, 1, 2}) == [2]
    assert who_leaves(reports, 4, {0, 1}) == []  # 2 already gone
    assert who_leaves(reports, 5, {0, 1, 2}) == []


def test_hold_blocks_at_once_and_doubles_with_each_partition():
    blocklist = Blocklist(after=2, cooldown=10.0, max_cooldown=35.0)
    blocklist.record_failure("h:1", now=0.0)  # the removal's own failure
    assert blocklist.hold("h:1", now=0.0) == 10.0
    with pytest.raises(BlocklistedError):
        blocklist.check("h:1", now=9.0)
    blocklist.check("h:1", now=10.5)
    blocklist.record_failure("h:1", now=20.0)
    assert blocklist.hold("h:1", now=20.0) == 20.0
    with pytest.raises(BlocklistedError):
        blocklist.check("h:1", now=39.0)
