"""The master loop on hand-made gradients: accept rules, policies end to end, termination, state."""

import json
import threading
import time

import numpy as np
import pytest

from tensorflow_elastic.ps import master as master_lib
from tensorflow_elastic.ps.config import PSConfig
from tensorflow_elastic.ps.gradient import Gradient
from tensorflow_elastic.ps.master import ARRAY_KEYS, Master
from tensorflow_elastic.ps.stats import Rejected

# A bound against hangs, not a timing: these threads share the cores with other tests.
TIMEOUT_S = 60.0


class Harness:
    """A master with registered workers that records every update and event."""

    def __init__(self, names=("a", "b", "c", "d"), version=0, **settings):
        self.updates = []
        self.events = []
        self.master = Master(PSConfig(**settings), self._apply, version=version,
                             on_event=lambda name, **fields: self.events.append((name, fields)))
        for name in names:
            self.master.add_worker(name)

    def _apply(self, arrays, version):
        self.updates.append(([a.copy() for a in arrays], version))

    def submit(self, worker, version=0, value=0.0, samples=1, loss=None, size=1):
        self.master.submit(Gradient(worker, version, [np.full(size, value, np.float32)],
                                    samples=samples, loss=loss))

    def applied_values(self):
        """The first element of each update, in order."""
        return [float(arrays[0][0]) for arrays, _ in self.updates]

    def event_names(self):
        return [name for name, _ in self.events]


# ------------------------------------------------------------------ settings


def test_default_settings_are_valid_and_resolve_from_the_block_size():
    config = PSConfig()
    config.validate()
    assert config.policy == "asypq"
    assert config.min_held() == 1 and config.take_limit(0) == 1 and config.take_limit(4) == 4
    assert PSConfig(synch_block_size=3).min_held() == 3
    assert PSConfig(max_to_accept=2).take_limit(9) == 2


@pytest.mark.parametrize("settings, message", [
    ({"policy": "lifo"}, "unknown policy 'lifo'; choose one of: synch, fifo, asynch, asypq"),
    ({"synch_block_size": 0}, "synch_block_size must be at least 1"),
    ({"max_staleness": -1}, "max_staleness must be at least 0"),
    ({"iterations": 2.5}, "iterations must be a whole number"),
    ({"workers": True}, "workers must be a whole number"),
    ({"convergence_tolerance": -0.1}, "convergence_tolerance must be a finite number >= 0"),
    ({"synch_block_size": 3, "min_to_accept": 2}, "raise min_to_accept or lower synch_block_size"),
    ({"min_to_accept": 3, "max_to_accept": 2}, "raise max_to_accept"),
    ({"synch_block_size": 4, "asynch_max": 2}, "raise asynch_max"),
])
def test_bad_settings_say_what_to_change(settings, message):
    with pytest.raises(ValueError, match=message):
        PSConfig(**settings).validate()


def test_replace_returns_a_validated_copy():
    config = PSConfig(policy="fifo")
    changed = config.replace(synch_block_size=2, asynch_max=4)
    assert (changed.synch_block_size, changed.asynch_max, changed.policy) == (2, 4, "fifo")
    assert config.synch_block_size == 1
    with pytest.raises(ValueError, match="unknown PS setting.*block_size"):
        config.replace(block_size=2)
    with pytest.raises(ValueError, match="raise asynch_max"):
        config.replace(synch_block_size=8, asynch_max=2)


def test_master_refuses_invalid_settings():
    with pytest.raises(ValueError, match="unknown policy"):
        Master(PSConfig(policy="nope"), lambda arrays, version: None)


# ----------------------------------------------------------------- accepting


def test_rejections_are_counted_by_reason_and_the_master_keeps_going():
    h = Harness(names=("a", "b"), version=3, policy="fifo", max_staleness=1, max_to_accept=8)
    h.submit("a", version=2, value=1.0)      # staleness 1: accepted
    h.submit("a", version=1, value=2.0)      # staleness 2: stale
    h.submit("b", version=4, value=3.0)      # from the future
    h.submit("z", version=3, value=4.0)      # never registered
    h.submit("b", version=3, value=5.0)      # accepted
    assert h.master.run_once(0) == 2
    assert h.applied_values() == [1.0, 5.0]
    stats = h.master.stats()
    assert stats["accepted"] == 2 and stats["rejected_total"] == 3
    assert stats["rejected"] == {Rejected.STALE: 1, Rejected.FINISHED: 0,
                                 Rejected.UNKNOWN_WORKER: 1, Rejected.FUTURE_VERSION: 1,
                                 Rejected.DUPLICATE: 0}
    assert Rejected.UNKNOWN_WORKER == "unknown_worker"  # reasons are plain strings in JSON
    assert stats["per_worker"]["a"] == {"accepted": 1, "rejected": 1, "samples": 1}


def test_a_finished_worker_keeps_what_it_sent_before_and_is_refused_after():
    h = Harness(names=("a",), policy="fifo", max_to_accept=4)
    h.submit("a", value=1.0)
    h.master.remove_worker("a", finished=True)
    h.submit("a", value=2.0)
    h.master.run_once(0)
    assert h.applied_values() == [1.0]
    assert h.master.stats()["rejected"]["finished"] == 1
    h.master.add_worker("a")  # a restarted worker with the same name starts afresh
    h.submit("a", version=1, value=3.0)
    h.master.run_once(0)
    assert h.applied_values() == [1.0, 3.0]


def test_a_dead_worker_loses_its_queued_and_held_gradients_and_is_then_unknown():
    h = Harness(names=("a", "b"), policy="fifo", min_to_accept=3, max_to_accept=3)
    h.submit("a", value=1.0)
    h.submit("b", value=2.0)
    h.master.run_once(0)          # both held: 3 are needed
    h.submit("a", value=3.0)      # queued
    h.submit("b", value=4.0)
    h.master.remove_worker("a")
    stats = h.master.stats()
    assert (stats["held"], stats["queued"], stats["dropped"]["worker_left"]) == (1, 1, 2)
    h.submit("a", value=5.0)
    h.master.run_once(0)
    assert h.master.stats()["rejected"]["unknown_worker"] == 1
    assert h.updates == []
    assert ("ps_worker_removed", {"worker": "a", "finished": False, "dropped": 2, "live": 1}) \
        in h.events


def test_a_held_gradient_that_ages_past_max_staleness_is_dropped():
    h = Harness(names=("a", "b"), policy="asypq", min_to_accept=2, max_staleness=1)
    h.submit("a", value=1.0)
    h.submit("b", value=2.0)
    assert h.master.run_once(0) == 1   # a applied (tie by arrival); b (version 0) still held
    h.submit("a", version=1, value=3.0)
    assert h.master.run_once(0) == 1   # the fresher a goes first; b is now 2 versions behind
    assert h.applied_values() == [1.0, 3.0]
    stats = h.master.stats()
    assert stats["held"] == 0 and stats["dropped"]["stale"] == 1


# ---------------------------------------------------------- policies end to end


# Arrival order of (worker, version, value) at master version 3.
MIXED = [("a", 1, 10.0), ("b", 3, 11.0), ("c", 2, 12.0), ("d", 3, 13.0)]


@pytest.mark.parametrize("policy, expected", [
    ("fifo", [10.0, 11.0, 12.0, 13.0]),
    ("granular", [10.0, 11.0, 12.0, 13.0]),
    ("wskew", [10.0, 11.0, 12.0, 13.0]),
    ("asynch", [11.0, 13.0, 12.0, 10.0]),
    ("asypq", [11.0, 13.0, 12.0, 10.0]),
    ("stale", [10.0, 12.0, 11.0, 13.0]),
    ("cdismin", [10.0, 11.0, 12.0, 13.0]),  # no update yet: arrival order
])
def test_one_iteration_applies_in_the_policy_order(policy, expected):
    h = Harness(version=3, policy=policy)
    for worker, version, value in MIXED:
        h.submit(worker, version=version, value=value)
    assert h.master.run_once(0) == 4
    assert h.applied_values() == expected
    assert [version for _, version in h.updates] == [4, 5, 6, 7]
    stats = h.master.stats()
    assert stats["version"] == 7 and stats["applied"] == 4
    # Staleness when applied: each update moves the version on by one.
    lags = {"fifo": [2, 1, 3, 3], "asypq": [0, 1, 3, 5], "stale": [2, 2, 2, 3]}
    if policy in lags:
        assert stats["staleness"]["histogram"] == {
            lag: lags[policy].count(lag) for lag in sorted(set(lags[policy]))}


def test_cdis_orders_against_the_update_the_master_applied():
    h = Harness(names=("a", "b", "c"), policy="cdismax")
    h.master.submit(Gradient("a", 0, [np.array([1.0, 0.0], np.float32)]))
    h.master.run_once(0)                               # reference: [1, 0]
    for worker, values in [("a", [1.0, 0.25]), ("b", [0.0, 1.0]), ("c", [-1.0, 0.0])]:
        h.master.submit(Gradient(worker, 1, [np.array(values, np.float32)]))
    h.master.run_once(0)
    firsts = [arrays[0].tolist() for arrays, _ in h.updates[1:]]
    # [-1, 0] is farthest from [1, 0]; then, against [-1, 0], [1, 0.25] is farther than [0, 1].
    assert firsts == [[-1.0, 0.0], [1.0, 0.25], [0.0, 1.0]]


def test_wskew_weights_the_block_by_inverse_sample_share():
    h = Harness(names=("a", "b"), policy="wskew", synch_block_size=2)
    h.submit("a", value=1.0, samples=30)
    h.submit("b", value=5.0, samples=10)
    assert h.master.run_once(0) == 1
    assert h.applied_values() == [pytest.approx(0.25 * 1.0 + 0.75 * 5.0)]
    fifo = Harness(names=("a", "b"), policy="fifo", synch_block_size=2)
    fifo.submit("a", value=1.0, samples=30)
    fifo.submit("b", value=5.0, samples=10)
    fifo.master.run_once(0)
    assert fifo.applied_values() == [3.0]


def test_granular_checks_each_gradient_against_the_newest_version_on_the_fast_path():
    h = Harness(names=("a", "b", "c"), policy="granular", max_staleness=0)
    h.submit("a", value=1.0)
    h.submit("b", value=2.0)            # version 0, but a has made it 1 by then
    h.submit("c", version=0, value=3.0)
    assert h.master.run_once(0) == 1
    stats = h.master.stats()
    assert stats["fast_path"] == 1 and stats["rejected"]["stale"] == 2
    # fifo accepts the whole take against version 0, then drops what aged past the bound.
    fifo = Harness(names=("a", "b", "c"), policy="fifo", max_staleness=0)
    for worker in "abc":
        fifo.submit(worker)
    assert fifo.master.run_once(0) == 1
    stats = fifo.master.stats()
    assert (stats["accepted"], stats["dropped"]["stale"], stats["fast_path"]) == (3, 2, 0)


def test_granular_goes_through_the_heap_when_something_is_already_held():
    h = Harness(names=("a", "b"), policy="fifo", min_to_accept=3, max_to_accept=3)
    h.submit("a", value=1.0)
    h.submit("b", value=2.0)
    assert h.master.run_once(0) == 0 and h.master.stats()["held"] == 2
    h.master.update_config(policy="granular")
    h.submit("a", value=3.0)
    assert h.master.run_once(0) == 3
    assert h.applied_values() == [1.0, 2.0, 3.0]
    assert h.master.stats()["fast_path"] == 0


# ---------------------------------------------------------------------- synch


def test_synch_applies_one_mean_per_round_of_every_live_worker():
    h = Harness(names=("a", "b", "c"), policy="synch")
    h.submit("a", value=1.0)
    h.submit("b", value=2.0)
    assert h.master.run_once(0) == 0
    h.submit("a", value=9.0)            # a second gradient from a in this round
    h.submit("c", value=3.0)
    assert h.master.run_once(0) == 1
    assert h.updates[0][1] == 1 and h.applied_values() == [2.0]
    h.submit("a", value=4.0)            # computed on version 0: stale now
    h.master.run_once(0)
    stats = h.master.stats()
    assert stats["rejected"]["duplicate"] == 1 and stats["rejected"]["stale"] == 1


def test_synch_stops_waiting_for_a_worker_that_left():
    h = Harness(names=("a", "b", "c"), policy="synch")
    h.submit("a", value=1.0)
    h.submit("b", value=3.0)
    assert h.master.run_once(0) == 0
    h.master.remove_worker("c")
    assert h.master.run_once(0) == 1   # woken by the removal, with nothing new queued
    assert h.applied_values() == [2.0]


def test_synch_includes_a_finished_workers_last_gradient():
    h = Harness(names=("a", "b"), policy="synch")
    h.submit("a", value=1.0)
    h.master.run_once(0)
    h.master.remove_worker("a", finished=True)
    h.submit("b", value=3.0)
    assert h.master.run_once(0) == 1
    assert h.applied_values() == [2.0]


def test_synch_with_workers_set_waits_for_them_to_register_before_the_first_round():
    h = Harness(names=("a",), policy="synch", workers=2)
    h.submit("a", value=1.0)
    assert h.master.run_once(0) == 0
    h.master.add_worker("b")
    h.submit("b", value=3.0)
    assert h.master.run_once(0) == 1 and h.applied_values() == [2.0]


# ------------------------------------------------------- how many per iteration


def test_a_backed_up_queue_is_taken_one_live_worker_count_per_iteration():
    h = Harness(names=("a", "b"), policy="fifo")
    for value in range(5):
        h.submit("ab"[value % 2], value=float(value))
    assert h.master.run_once(0) == 2
    assert h.master.stats()["queued"] == 3
    assert h.master.run_once(0) == 2
    assert h.master.run_once(0) == 1
    assert h.applied_values() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_blocks_of_num_to_apply_are_formed_once_min_to_accept_are_held():
    h = Harness(policy="fifo", synch_block_size=2, min_to_accept=3, max_to_accept=4)
    for value in range(6):
        h.submit("abcd"[value % 4], value=float(value))
    assert h.master.run_once(0) == 1          # take 4, apply 2, hold 2 (< 3)
    assert h.applied_values() == [0.5]
    assert (h.master.stats()["held"], h.master.stats()["queued"]) == (2, 2)
    assert h.master.run_once(0) == 1          # take 2 more: 4 held, apply 2, hold 2
    assert h.applied_values() == [0.5, 2.5]


def test_asynch_max_bounds_what_is_held():
    h = Harness(policy="fifo", asynch_max=3, min_to_accept=3, max_to_accept=4)
    for value in range(5):
        h.submit("abcd"[value % 4], value=float(value))
    assert h.master.run_once(0) == 1          # room for 3: take 3, apply 1
    assert (h.master.stats()["held"], h.master.stats()["queued"]) == (2, 2)
    assert h.master.run_once(0) == 1          # room for 1
    assert (h.master.stats()["held"], h.master.stats()["queued"]) == (2, 1)


def test_settings_changed_while_running_take_effect_at_the_next_iteration():
    h = Harness(names=("a", "b"), policy="fifo")
    h.submit("a", value=1.0)
    h.submit("b", value=3.0)
    assert h.master.run_once(0) == 2
    h.master.update_config(synch_block_size=2, asynch_max=2)
    assert h.master.config.synch_block_size == 2
    h.submit("a", version=2, value=5.0)
    h.submit("b", version=2, value=7.0)
    assert h.master.run_once(0) == 1
    assert h.applied_values() == [1.0, 3.0, 6.0]
    with pytest.raises(ValueError, match="raise asynch_max"):
        h.master.update_config(synch_block_size=3)
    assert h.master.config.synch_block_size == 2
    assert ("ps_config_changed", {"changes": {"synch_block_size": 2, "asynch_max": 2}}) in h.events


# ---------------------------------------------------------------- termination


def test_async_stops_after_workers_times_iterations_accepted_and_flushes_what_is_held():
    h = Harness(names=("a", "b"), policy="fifo", iterations=2, synch_block_size=2,
                max_to_accept=8)
    for value in range(5):
        h.submit("ab"[value % 2], value=float(value))
    assert not h.master.should_stop()
    assert h.master.run_once(0) == 2
    assert h.master.should_stop() and h.master.stop_reason == "iterations"
    stats = h.master.stats()
    assert stats["accepted"] == 4 and stats["rejected"]["finished"] == 1
    assert stats["applied"] == 4 and stats["held"] == 0
    assert h.event_names().count("ps_stop") == 1
    assert dict(h.events)["ps_stop"]["target"] == 4


def test_a_last_partial_block_is_flushed_at_the_stop():
    h = Harness(names=("a", "b", "c"), policy="fifo", iterations=1, synch_block_size=2)
    for worker in "abc":
        h.submit(worker, value=1.0)
    assert h.master.run_once(0) == 2            # a block of 2, then the last one alone
    assert h.master.stats()["applied"] == 3


def test_without_workers_set_the_total_follows_the_most_workers_live_at_once():
    h = Harness(names=("a", "b"), policy="fifo", iterations=2)
    h.master.add_worker("c")
    h.master.remove_worker("c")
    for value in range(5):
        h.submit("ab"[value % 2], value=float(value))
        h.master.run_once(0)
    assert not h.master.should_stop()
    h.submit("a", value=5.0)
    h.master.run_once(0)
    assert h.master.should_stop() and h.master.stats()["accepted"] == 6


def test_synch_does_not_count_iterations_for_the_workers():
    h = Harness(names=("a",), policy="synch", iterations=1)
    for version in range(3):
        h.submit("a", version=version)
        h.master.run_once(0)
    assert h.master.version == 3 and not h.master.should_stop()


def test_a_loss_plateau_over_the_window_stops_the_job():
    h = Harness(names=("a",), policy="fifo", convergence_window=2, convergence_tolerance=0.01)
    for version, loss in enumerate([1.0, 0.9, 0.5, 0.4, None, 0.45, 0.45]):
        assert not h.master.should_stop()
        h.submit("a", version=version, loss=loss)
        h.master.run_once(0)
    assert h.master.stop_reason == "converged"
    assert dict(h.events)["ps_stop"]["last_loss"] == 0.45


# ------------------------------------------------------------------ membership


def test_workers_joining_and_leaving_are_events_and_adding_twice_is_one_worker():
    h = Harness(names=("a", "b"))
    h.master.add_worker("a")
    h.master.remove_worker("zz")
    h.master.remove_worker("b", finished=True)
    assert h.master.live_workers() == ["a"]
    assert h.event_names() == ["ps_worker_added", "ps_worker_added", "ps_worker_removed"]


# ---------------------------------------------------------------- checkpoints


def test_state_dict_round_trip_resumes_counts_version_reference_and_shares():
    h = Harness(names=("a", "b"), policy="wskew", synch_block_size=2)
    h.submit("a", value=1.0, samples=30, loss=0.5)
    h.submit("b", value=5.0, samples=10, loss=0.7)
    h.master.run_once(0)
    state = h.master.state_dict()
    plain = {key: value for key, value in state.items() if key not in ARRAY_KEYS}
    restored_state = json.loads(json.dumps(plain))
    restored_state["reference"] = [a.copy() for a in state["reference"]]

    resumed = Harness(names=("a", "b"), policy="wskew", synch_block_size=2)
    resumed.master.load_state_dict(restored_state)
    assert resumed.master.version == 1
    assert resumed.master.stats() == {**h.master.stats(), "live_workers": ["a", "b"]}
    resumed.submit("a", version=1, value=1.0, samples=10)   # a: 40 samples, b: 20
    resumed.submit("b", version=1, value=4.0, samples=10)
    resumed.master.run_once(0)
    assert resumed.applied_values() == [pytest.approx((1.0 / 40 + 4.0 / 20) / (1 / 40 + 1 / 20))]
    assert resumed.updates[0][1] == 2


def test_a_restored_reference_orders_cdis_before_any_new_update():
    h = Harness(names=("a",), policy="cdismin")
    h.master.submit(Gradient("a", 0, [np.array([0.0, 1.0], np.float32)]))
    h.master.run_once(0)
    resumed = Harness(names=("a", "b"), policy="cdismin")
    resumed.master.load_state_dict(h.master.state_dict())
    resumed.master.submit(Gradient("a", 1, [np.array([1.0, 0.0], np.float32)]))
    resumed.master.submit(Gradient("b", 1, [np.array([0.125, 1.0], np.float32)]))
    resumed.master.run_once(0)
    assert [arrays[0].tolist() for arrays, _ in resumed.updates] == [[0.125, 1.0], [1.0, 0.0]]
    assert master_lib.ARRAY_KEYS == ("reference",)


# ------------------------------------------------------------------- threads


def test_submit_does_not_wait_for_an_update_in_progress():
    release = threading.Event()
    entered = threading.Event()

    def slow_apply(arrays, version):
        entered.set()
        release.wait(TIMEOUT_S)

    master = Master(PSConfig(policy="fifo"), slow_apply)
    master.add_worker("a")
    master.submit(Gradient("a", 0, [np.zeros(1, np.float32)]))
    loop = threading.Thread(target=master.run_once, args=(0,))
    loop.start()
    assert entered.wait(TIMEOUT_S)
    started = time.monotonic()
    master.submit(Gradient("a", 0, [np.zeros(1, np.float32)]))
    stats = master.stats()
    assert time.monotonic() - started < 1.0 and stats["queued"] == 1
    release.set()
    loop.join(TIMEOUT_S)
    assert not loop.is_alive() and master.version == 1


def test_gradients_from_many_threads_are_all_accepted_once():
    h = Harness(names=[f"w{i}" for i in range(8)], policy="asypq", max_to_accept=5)
    stop = threading.Event()

    def serve():  # the parameter server's loop
        while not stop.is_set():
            h.master.run_once(0.01)

    loop = threading.Thread(target=serve)
    loop.start()

    def push(worker):
        for _ in range(50):
            h.master.submit(Gradient(worker, 0, [np.ones(4, np.float32)]))

    pushers = [threading.Thread(target=push, args=(f"w{i}",)) for i in range(8)]
    for thread in pushers:
        thread.start()
    for thread in pushers:
        thread.join(TIMEOUT_S)
    deadline = time.monotonic() + TIMEOUT_S
    while h.master.stats()["accepted"] < 400 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    loop.join(TIMEOUT_S)
    stats = h.master.stats()
    assert not loop.is_alive()
    assert stats["accepted"] == 400 and stats["rejected_total"] == 0
    assert stats["updates"] == 400 and h.master.version == 400
    assert sorted(v for _, v in h.updates) == list(range(1, 401))
    assert max(max(stats["staleness"]["histogram"]), 0) == stats["staleness"]["max"]
    assert stats["staleness"]["median"] <= stats["staleness"]["p95"] <= stats["staleness"]["max"]


def test_a_push_waits_until_its_gradient_was_applied_held_or_rejected():
    h = Harness(names=["a", "b"], policy="fifo", synch_block_size=2)
    applied, held, rejected = (Gradient(w, v, [np.ones(1, np.float32)])
                               for w, v in (("a", 0), ("b", 0), ("nobody", 0)))
    h.master.submit(applied)
    assert not h.master.wait_dealt_with(applied, 0.05)  # nothing ran the loop yet
    h.master.run_once(0)
    assert h.master.wait_dealt_with(applied, 0) and h.master.stats()["held"] == 1
    h.master.submit(held)
    h.master.submit(rejected)
    h.master.run_once(0)
    assert h.master.wait_dealt_with(held, 0) and h.master.wait_dealt_with(rejected, 0)
    assert h.master.version == 1 and h.master.stats()["rejected"]["unknown_worker"] == 1


def test_a_waiting_push_returns_when_its_worker_is_dropped_or_the_master_closes():
    h = Harness(names=["a", "b"], policy="fifo")
    dropped, left = (Gradient(w, 0, [np.ones(1, np.float32)]) for w in ("a", "b"))
    h.master.submit(dropped)
    h.master.submit(left)
    h.master.remove_worker("a")
    assert h.master.wait_dealt_with(dropped, 0) and not h.master.wait_dealt_with(left, 0)
    h.master.close()
    assert h.master.wait_dealt_with(left, 0)


def test_a_divergence_stops_the_job_at_once_and_says_what_to_change():
    h = Harness(policy="cdismin", iterations=100)
    h.submit("a", loss=2.0)
    h.master.run_once(0)
    h.master.diverge("b", "loss became nan")
    h.submit("c", version=1)
    h.master.run_once(0)
    assert h.master.should_stop() and h.master.stop_reason == master_lib.STOP_DIVERGED
    assert h.master.stop_message == (
        "the training diverged: the loss became nan on worker b at version 1 under policy "
        "cdismin; lower the learning rate or bound the staleness with max_staleness "
        "(ps.PSConfig(max_staleness=N), or tfelastic ps-configure --max_staleness N)")
    assert h.master.stats()["rejected"]["finished"] == 1 and h.master.version == 1
    assert ("ps_stop", {"reason": "diverged", "accepted": 1, "version": 1, "last_loss": 2.0,
                        "message": h.master.stop_message}) in h.events
