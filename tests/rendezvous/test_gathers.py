"""Barriers and exchanges of one generation."""

from __future__ import annotations

import asyncio

from tensorflow_elastic.rendezvous.gathers import Gathers


def test_a_gather_completes_once_every_member_put_a_value():
    gathers = Gathers()
    members = {1, 2, 3}
    assert not gathers.put("sync/k", 1, b"a", members)
    assert not gathers.put("sync/k", 3, b"c", members)
    assert gathers.missing("sync/k", members) == [2]
    assert gathers.result("sync/k") is None and not gathers.changed("sync/k").is_set()
    assert gathers.put("sync/k", 2, b"b", members)
    assert gathers.result("sync/k") == {1: b"a", 2: b"b", 3: b"c"}
    assert gathers.changed("sync/k").is_set()
    assert not gathers.put("sync/k", 1, b"retried", members)  # a retry changes nothing
    assert gathers.result("sync/k")[1] == b"a"


def test_other_nodes_values_do_not_stand_in_for_a_members():
    gathers = Gathers()
    assert not gathers.put("barrier/b", 7, b"", {1, 2})
    assert not gathers.put("barrier/b", 1, b"", {1, 2})
    assert gathers.missing("barrier/b", {1, 2}) == [2]


def test_the_end_of_the_generation_wakes_the_waiters_and_forgets_everything():
    async def scenario() -> Gathers:
        gathers = Gathers({"sync/loaded": {1: b"x"}})
        gathers.put("sync/k", 1, b"a", {1, 2})
        waiter = asyncio.ensure_future(gathers.changed("sync/k").wait())
        assert gathers.put("barrier/b", 1, b"", {1})
        gathers.saved_as("barrier/b", 7)
        assert (gathers.save_ticket("barrier/b"), gathers.save_ticket("sync/loaded")) == (7, 0)
        gathers.end()
        await asyncio.wait_for(waiter, 1.0)
        return gathers

    gathers = asyncio.run(scenario())
    assert gathers.completed == {}
    assert gathers.missing("sync/k", {1, 2}) == [1, 2]
    assert gathers.save_ticket("barrier/b") == 0
    assert not gathers.changed("sync/k").is_set()
