"""A job whose loss or gradients become NaN or Inf: refused by the PS, reported once where it
happened, and the end of the job for every worker and the PS (a restart would diverge again)."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_elastic.errors import TrainingDiverged
from tensorflow_elastic.launch.error_files import restartable
from tensorflow_elastic.ps.config import PSConfig
from tensorflow_elastic.ps.server import ParameterServer
from tensorflow_elastic.ps.worker import PSWorker

TIMEOUT_S = 60


def diverging_after(iterations: int, where: str):
    """A gradient_fn for one variable whose loss (or gradient) becomes Inf after `iterations`."""
    calls = []

    def gradient(batch):
        calls.append(batch)
        bad = len(calls) > iterations
        loss = np.float32(np.inf if bad and where == "loss" else 1.0)
        grad = np.full(4, np.nan if bad and where == "gradient" else 0.01, np.float32)
        return loss, [grad]

    return gradient


def endless():
    while True:
        yield np.zeros((8, 4), np.float32)


def run_workers(server: ParameterServer, gradient_fns) -> list[BaseException | object]:
    """One thread per gradient_fn; what each worker's run() returned or raised."""
    outcomes: list = [None] * len(gradient_fns)

    def work(index: int, gradient_fn) -> None:
        worker = PSWorker(server.address, [tf.Variable(np.ones(4, np.float32))], gradient_fn)
        try:
            outcomes[index] = worker.run(endless())
        except BaseException as e:  # noqa: BLE001 - the outcome under test
            outcomes[index] = e

    threads = [threading.Thread(target=work, args=item) for item in enumerate(gradient_fns)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT_S)
    return outcomes


@pytest.fixture
def server():
    server = ParameterServer([tf.Variable(np.ones(4, np.float32))], tf.keras.optimizers.SGD(0.1),
                             PSConfig(policy="asypq", iterations=10_000), lease_timeout=5.0)
    server.start()
    yield server
    server.stop()


@pytest.mark.parametrize("where, what", [("loss", "the loss became inf"),
                                         ("gradient", "the gradient for ")])
def test_a_divergence_ends_every_worker_and_the_ps_with_one_message_that_says_what_to_change(
        server, where, what):
    healthy = diverging_after(10**9, where)
    outcomes = run_workers(server, [diverging_after(5, where), healthy])
    diverged, stopped = outcomes
    assert isinstance(diverged, TrainingDiverged), diverged
    assert str(diverged).startswith(f"the training diverged: {what}")
    assert "at iteration 5 (parameter version " in str(diverged)  # the first call warms up
    assert ("under policy asypq; lower the learning rate or bound the staleness with "
            "max_staleness") in str(diverged)
    with pytest.raises(TrainingDiverged) as ended:
        server.wait(TIMEOUT_S)
    assert str(ended.value).startswith(f"the training diverged: {what}")
    assert re.search(r" on worker \d+ at version \d+ under policy asypq", str(ended.value))
    assert isinstance(stopped, TrainingDiverged), stopped
    assert str(stopped) == f"stopped by the parameter server: {ended.value}"
    assert not restartable(diverged)
    stats = server.stats()
    assert stats["stop_reason"] == "diverged" and stats["stop_message"] == str(ended.value)
    assert sum(stats["bad_requests"].values()) == 1  # refused once, by the worker that saw it
    assert np.isfinite(server.parameters.arrays()[1][0]).all()


def test_the_synchronous_policy_advises_only_the_learning_rate():
    server = ParameterServer([tf.Variable(np.ones(4, np.float32))], tf.keras.optimizers.SGD(0.1),
                             PSConfig(policy="synch", iterations=100), lease_timeout=5.0)
    server.start()
    try:
        [diverged] = run_workers(server, [diverging_after(2, "loss")])
        assert str(diverged).endswith("under policy synch; lower the learning rate")
        with pytest.raises(TrainingDiverged):
            server.wait(TIMEOUT_S)
    finally:
        server.stop()
