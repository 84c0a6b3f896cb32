"""Each policy's order, block rule and weights on hand-made gradients (no master, no TensorFlow)."""

import numpy as np
import pytest

from tensorflow_elastic.ps.config import POLICIES, PSConfig
from tensorflow_elastic.ps.gradient import Gradient
from tensorflow_elastic.ps.policies import make_policy


def grad(sequence, version=0, values=(1.0,), worker="w", samples=1):
    return Gradient(worker=worker, version=version, arrays=[np.array(values, np.float32)],
                    samples=samples, sequence=sequence)


def pushed(name, gradients):
    policy = make_policy(name)
    for gradient in gradients:
        policy.push(gradient)
    return policy


def popped_sequences(policy):
    return [g.sequence for g in policy.pop(len(policy))]


def test_every_configurable_policy_exists_and_unknown_names_are_refused():
    assert [make_policy(name).name for name in POLICIES] == list(POLICIES)
    with pytest.raises(ValueError, match="choose one of: synch, fifo"):
        make_policy("lifo")


@pytest.mark.parametrize("name", ["fifo", "granular", "wskew"])
def test_arrival_order_policies_ignore_push_order_and_version(name):
    policy = pushed(name, [grad(2, version=5), grad(0, version=1), grad(1, version=9)])
    assert popped_sequences(policy) == [0, 1, 2]


# Arrival order 0..3; versions 1, 3, 2, 3 (so staleness at version 3 is 2, 0, 1, 0).
VERSIONS = [1, 3, 2, 3]


@pytest.mark.parametrize("name", ["asynch", "asypq"])
def test_least_stale_first_with_ties_by_arrival(name):
    policy = pushed(name, [grad(i, version=v) for i, v in enumerate(VERSIONS)])
    assert popped_sequences(policy) == [1, 3, 2, 0]


def test_stale_applies_the_oldest_first_with_ties_by_arrival():
    policy = pushed("stale", [grad(i, version=v) for i, v in enumerate(VERSIONS)])
    assert popped_sequences(policy) == [0, 2, 1, 3]


@pytest.mark.parametrize("name", ["cdismin", "cdismax"])
def test_cosine_distance_without_a_reference_falls_back_to_arrival_order(name):
    policy = pushed(name, [grad(i, values=v) for i, v in enumerate([(0, 1), (1, 0), (-1, 0)])])
    assert popped_sequences(policy) == [0, 1, 2]


@pytest.mark.parametrize("name", ["cdismin", "cdismax"])
def test_an_all_zero_reference_counts_as_no_reference(name):
    policy = pushed(name, [grad(i, values=v) for i, v in enumerate([(0, 1), (1, 0), (-1, 0)])])
    policy.observe_update([np.zeros(2, np.float32)])
    assert popped_sequences(policy) == [0, 1, 2]


def test_cosine_distance_is_one_minus_cosine_and_a_zero_gradient_is_orthogonal():
    policy = make_policy("cdismin")
    policy.observe_update([np.array([2.0, 0.0], np.float32)])
    assert policy.distance(grad(0, values=(3, 0))) == pytest.approx(0.0)
    assert policy.distance(grad(0, values=(0, 5))) == pytest.approx(1.0)
    assert policy.distance(grad(0, values=(-1, 0))) == pytest.approx(2.0)
    assert policy.distance(grad(0, values=(0, 0))) == 1.0


def _apply_all(policy):
    """Pops one at a time and makes each popped gradient the reference, as the master does."""
    order = []
    while len(policy):
        (top,) = policy.pop(1)
        order.append(top.sequence)
        policy.observe_update(top.arrays)
    return order


def test_cdismin_recomputes_distances_after_every_update():
    # Reference [1, 0]: distances P 0.04, Q 0.40, R 0.30, so a fixed order would be P, R, Q.
    # After P = [1, 0.3] is applied, Q (0.20) is nearer than R (0.53).
    policy = make_policy("cdismin")
    policy.observe_update([np.array([1.0, 0.0], np.float32)])
    for gradient in [grad(0, values=(0.6, 0.8)), grad(1, values=(0.7, -0.71)),
                     grad(2, values=(1.0, 0.3))]:
        policy.push(gradient)
    assert _apply_all(policy) == [2, 0, 1]


def test_cdismax_recomputes_distances_after_every_update():
    # Reference [1, 0]: distances X 2.0, Y 1.0, Z 0.02, so a fixed order would be X, Y, Z.
    # After X = [-1, 0] is applied, Z (1.98) is farther than Y (1.0).
    policy = make_policy("cdismax")
    policy.observe_update([np.array([1.0, 0.0], np.float32)])
    for gradient in [grad(0, values=(0.0, 1.0)), grad(1, values=(1.0, 0.2)),
                     grad(2, values=(-1.0, 0.0))]:
        policy.push(gradient)
    assert _apply_all(policy) == [2, 1, 0]


def test_asynchronous_blocks_need_min_to_accept_held_and_flush_sends_a_smaller_last_block():
    config = PSConfig(policy="fifo", synch_block_size=2, min_to_accept=3)
    policy = pushed("fifo", [grad(0), grad(1)])
    assert policy.block_size(config, {"w"}, flush=False) == 0
    assert policy.block_size(config, {"w"}, flush=True) == 2
    policy.push(grad(2))
    assert policy.block_size(config, {"w"}, flush=False) == 2
    policy.pop(2)
    assert policy.block_size(config, {"w"}, flush=True) == 1


def test_granular_takes_one_gradient_at_a_time_whatever_the_block_settings():
    config = PSConfig(policy="granular", synch_block_size=3, min_to_accept=4)
    policy = make_policy("granular")
    assert policy.eager and not make_policy("fifo").eager
    assert policy.block_size(config, set(), flush=False) == 0
    policy.push(grad(0))
    assert policy.block_size(config, set(), flush=False) == 1


def test_synch_waits_for_one_gradient_from_every_live_worker():
    config = PSConfig(policy="synch", synch_block_size=5)
    policy = make_policy("synch")
    live = {"a", "b", "c"}
    assert policy.block_size(config, live, flush=True) == 0
    policy.push(grad(0, worker="a"))
    policy.push(grad(1, worker="b"))
    assert policy.block_size(config, live, flush=True) == 0
    assert policy.block_size(config, {"a", "b"}, flush=False) == 2  # c left: no longer waited for
    policy.push(grad(2, worker="c"))
    assert policy.block_size(config, live, flush=False) == 3


def test_synch_refuses_a_second_gradient_per_round_and_any_stale_one():
    config = PSConfig(policy="synch", max_staleness=10, asynch_max=1)
    policy = pushed("synch", [grad(0, worker="a")])
    assert not policy.admits(grad(1, worker="a"))
    assert policy.admits(grad(1, worker="b"))
    assert policy.staleness_bound(config) == 0
    assert policy.capacity(config) is None
    assert make_policy("fifo").staleness_bound(config) == 10
    assert make_policy("fifo").capacity(config) == 1


def test_wskew_weights_are_the_normalised_inverse_sample_shares():
    # Shares: a 30/40, b 10/40; inverse 4/3 and 4, normalised 0.25 and 0.75.
    block = [grad(0, worker="a"), grad(1, worker="b")]
    weights = make_policy("wskew").weights(block, {"a": 30, "b": 10})
    np.testing.assert_allclose(weights, [0.25, 0.75])
    np.testing.assert_allclose(make_policy("wskew").weights(block, {"a": 30}), [1 / 31, 30 / 31])
    assert make_policy("fifo").weights(block, {"a": 30, "b": 10}) is None


def test_remove_if_and_drain_keep_the_rest_in_order():
    policy = pushed("stale", [grad(i, version=v, worker=w)
                              for i, (v, w) in enumerate([(3, "a"), (1, "b"), (2, "a"), (0, "b")])])
    removed = policy.remove_if(lambda g: g.worker == "b")
    assert sorted(g.sequence for g in removed) == [1, 3]
    assert [g.sequence for g in policy.drain()] == [0, 2]
    assert len(policy) == 0 and policy.pop(1) == []
