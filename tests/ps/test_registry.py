"""Worker ids and leases of the parameter server, on a fake clock."""

import pytest

from tensorflow_elastic.ps.registry import NotTheWorker, WorkerRegistry


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def ids(registration: tuple[str, str, bool]) -> tuple[str, bool]:
    worker_id, _, is_new = registration
    return worker_id, is_new


def test_ids_are_handed_out_in_order_and_never_reused():
    registry = WorkerRegistry(5.0, Clock())
    _, zero_secret, _ = registry.register()
    _, one_secret, _ = registry.register()
    registry.remove("1", one_secret)
    assert ids(registry.register()) == ("2", True)
    assert ids(registry.register("1")) == ("1", True)  # an earlier worker may come back, same id
    assert registry.register("0", zero_secret) == ("0", zero_secret, False)  # no change
    registry.next_id = 1                                # a checkpoint never lowers the counter
    assert ids(registry.register()) == ("3", True)


def test_a_live_worker_id_without_its_secret_is_refused_and_changes_nothing():
    registry = WorkerRegistry(5.0, Clock())
    worker_id, secret, _ = registry.register()
    for call in (lambda guess: registry.register(worker_id, guess),
                 lambda guess: registry.touch(worker_id, guess),
                 lambda guess: registry.remove(worker_id, guess, finished=True)):
        for guess in ("", "0" * len(secret)):
            with pytest.raises(NotTheWorker, match="secret"):
                call(guess)
    assert registry.live() == [worker_id] and registry.finished == 0
    assert registry.remove(worker_id, secret, finished=True) and registry.finished == 1


def test_silent_workers_expire_and_touch_renews_the_lease():
    clock = Clock()
    registry = WorkerRegistry(5.0, clock)
    _, zero_secret, _ = registry.register()
    _, one_secret, _ = registry.register()
    clock.now += 4.0
    assert registry.touch("1", one_secret)
    clock.now += 2.0
    assert registry.expired() == ["0"]
    assert registry.live() == ["1"]
    assert not registry.touch("0", zero_secret)  # it must register again
    assert registry.expired() == []


def test_finished_workers_are_counted_and_a_bad_lease_is_refused():
    registry = WorkerRegistry(1.0, Clock())
    _, zero_secret, _ = registry.register()
    _, one_secret, _ = registry.register()
    assert registry.remove("0", zero_secret, finished=True) and registry.finished == 1
    assert registry.remove("1", one_secret) and registry.finished == 1
    assert not registry.remove("1", one_secret)
    with pytest.raises(ValueError, match="lease_timeout must be > 0"):
        WorkerRegistry(0)
