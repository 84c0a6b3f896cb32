"""Worker ids and leases of the parameter server, on a fake clock."""

import pytest

from tensorflow_elastic.ps.registry import WorkerRegistry


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_ids_are_handed_out_in_order_and_never_reused():
    registry = WorkerRegistry(5.0, Clock())
    assert registry.register() == ("0", True)
    assert registry.register() == ("1", True)
    registry.remove("1")
    assert registry.register() == ("2", True)
    assert registry.register("1") == ("1", True)   # an earlier worker may come back under its id
    assert registry.register("0") == ("0", False)  # re-registering a live worker is no change
    registry.next_id = 1                           # a checkpoint never lowers the counter
    assert registry.register() == ("3", True)


def test_silent_workers_expire_and_touch_renews_the_lease():
    clock = Clock()
    registry = WorkerRegistry(5.0, clock)
    registry.register()
    registry.register()
    clock.now += 4.0
    assert registry.touch("1")
    clock.now += 2.0
    assert registry.expired() == ["0"]
    assert registry.live() == ["1"]
    assert not registry.touch("0")  # it must register again
    assert registry.expired() == []


def test_finished_workers_are_counted_and_a_bad_lease_is_refused():
    registry = WorkerRegistry(1.0, Clock())
    registry.register()
    registry.register()
    assert registry.remove("0", finished=True) and registry.finished == 1
    assert registry.remove("1") and registry.finished == 1
    assert not registry.remove("1")
    with pytest.raises(ValueError, match="lease_timeout must be > 0"):
        WorkerRegistry(0)
