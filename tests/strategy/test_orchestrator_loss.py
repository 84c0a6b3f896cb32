"""Workers whose orchestrator is killed -9 and never comes back (real processes).

A training that has finished returns normally (the code after it runs) with a
warning; a worker that needs the orchestrator to re-form waits for it
$TFE_ORCHESTRATOR_WAIT seconds, then fails with a message that says so.
"""

import signal

import pytest

from tests.conftest import wait_until

pytestmark = pytest.mark.multiprocess

STEPS = 80
WAIT_S = "3"


def test_a_finished_training_returns_when_the_orchestrator_is_gone(orchestrator, start_workers):
    workers = start_workers(orchestrator.endpoint, 3, min_nodes=3, max_nodes=3, steps=STEPS,
                            env={"TFE_ORCHESTRATOR_WAIT": WAIT_S})
    for w in workers:
        w.wait_for_step(10)
    orchestrator.kill(signal.SIGKILL)
    for w in workers:
        assert w.wait() == 0, w.log_tail()
        assert w.result is not None, w.log_tail()  # the line after train(state) ran
        assert w.steps[-1]["step"] == STEPS
        assert "training finished at step" in "".join(w.output), w.log_tail()
    assert len({tuple(w.result["weights"]) for w in workers}) == 1


def test_a_reform_without_the_orchestrator_fails_clearly(orchestrator, start_workers):
    workers = start_workers(orchestrator.endpoint, 3, min_nodes=2, max_nodes=3, steps=10_000,
                            env={"TFE_ORCHESTRATOR_WAIT": WAIT_S})
    for w in workers:
        w.wait_for_step(10)
    orchestrator.kill(signal.SIGKILL)
    victim, survivors = workers[0], workers[1:]
    victim.signal(signal.SIGKILL)
    # The survivor whose collective reaches the dead peer first reports it, finds no
    # orchestrator for TFE_ORCHESTRATOR_WAIT seconds, and stops with a clear error.
    wait_until(lambda: any(w.proc.poll() is not None for w in survivors), timeout=120,
               what="a survivor to stop")
    failed = next(w for w in survivors if w.proc.poll() is not None)
    assert failed.proc.returncode != 0, failed.log_tail()
    log = "".join(failed.output)
    assert "ElasticJobFailed" in log and "TFE_ORCHESTRATOR_WAIT" in log, failed.log_tail()
    assert failed.result is None
