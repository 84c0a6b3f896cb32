"""How a run ends (completed or failed) and how the next job with the same run id starts it
afresh."""

from __future__ import annotations

import threading
import time

import pytest

from tensorflow_elastic.rendezvous import (GenerationChangedError, JobCompleteError,
                                           NodeRemovedError, Orchestrator, Phase, RunFailedError,
                                           RunSettings)

pytestmark = [pytest.mark.multiprocess, pytest.mark.light]


@pytest.mark.serial  # the restarted orchestrator binds the port the first one had
def test_a_completed_run_ends_as_completed_and_a_new_job_starts_it_afresh(
        start_orchestrator, nodes_for, tmp_path):
    state_dir = str(tmp_path / "state")
    first = start_orchestrator("--below_min_timeout", "2", "--state_dir", state_dir)
    nodes = nodes_for(first.endpoint, run_id="default")
    [(done, m1)] = nodes.join(1, 1, 1, heartbeat=None)
    done.leave("job complete")
    time.sleep(3)  # past --below_min_timeout: a completed run must not fail

    [run] = nodes.client().status()
    assert run.reason.startswith("completed: every node left")
    assert run.history[-1]["event"] == "run_completed"
    # The end is saved: a restarted orchestrator still knows the run completed.
    first.kill()
    second = start_orchestrator("--below_min_timeout", "2", "--state_dir", state_dir,
                                port=first.port)
    [run] = nodes.client().status()
    assert run.reason.startswith("completed: every node left")

    # The next job with the same run id (other bounds are fine) starts the run afresh;
    # ids and generations keep counting, so nothing of the first job is reused.
    [(again, m2), _] = nodes.join(2, 2, 2)
    assert m2.generation == m1.generation + 1
    assert min(m2.members) > m1.node_id
    [run] = again.status()
    assert (run.state, run.min_nodes, run.max_nodes) == ("ACTIVE", 2, 2)
    assert "run_restarted" in [h["event"] for h in run.history]
    with pytest.raises(NodeRemovedError):
        done.heartbeat()
    assert second.endpoint == first.endpoint


@pytest.mark.serial  # the live nodes' beats must keep arriving within a 1 s timeout
def test_a_failed_run_is_started_afresh_by_a_new_first_join(start_orchestrator, nodes_for, wait):
    server = start_orchestrator("--below_min_timeout", "1", heartbeat_timeout=1.0)
    nodes = nodes_for(server.endpoint)
    (a, _), (b, m1) = nodes.join(2, 2, 2)
    b.heartbeat()  # it has beaten: silent from here on
    b.stop_heartbeats()
    wait(lambda: a.heartbeat().state == "FORMING", what="the run falling below min_nodes")
    with pytest.raises(RunFailedError, match="not enough nodes came back within 1 s"):
        a.join(timeout=30)

    [(fresh, m2)] = nodes.join(1, 1, 1)
    assert m2.generation > m1.generation and m2.node_id > max(m1.members)
    [run] = fresh.status()
    assert (run.state, run.min_nodes, run.max_nodes) == ("ACTIVE", 1, 1)
    # The failed job's nodes are not part of the new one.
    with pytest.raises(NodeRemovedError, match="run 'job' failed"):
        a.heartbeat()


def test_the_completed_end_is_on_the_wire(start_orchestrator, nodes_for):
    orchestrator = start_orchestrator()
    nodes = nodes_for(orchestrator.endpoint, run_id="finished")
    [(done, _)] = nodes.join(1, 1, 1, heartbeat=None)
    done.leave("job complete")
    [run] = nodes.client().status()
    assert run.state == Phase.COMPLETED and run.state.ended


def test_an_orchestrator_that_serves_one_job_tells_whoever_comes_after_its_end_that_it_is_complete(
        nodes_for):
    server = Orchestrator(settings=RunSettings(restart_completed=False)).start()
    try:
        nodes = nodes_for(server.endpoint)
        [(done, m1)] = nodes.join(1, 1, 2, heartbeat=None)
        done.leave("job complete")
        late = nodes.client()
        for arrive in (lambda: late.join("127.0.0.1:20099", 1, 2, timeout=5),
                       lambda: late.register("127.0.0.1:20099", 1, 2)):
            with pytest.raises(JobCompleteError, match="the job is complete"):
                arrive()
        [run] = late.status()
        assert run.reason.startswith("completed: every node left")
        assert "run_restarted" not in [h["event"] for h in run.history]
        assert run.nodes == [] and run.membership.generation == m1.generation
    finally:
        server.stop()


def test_nodes_waiting_when_the_members_finish_the_job_are_told_it_is_complete(nodes_for, wait):
    """The members finished training: a node still waiting to join must not start the job
    again on its own (it would train from nothing), whatever its arrival's timing."""
    server = Orchestrator(settings=RunSettings(restart_completed=False)).start()
    try:
        nodes = nodes_for(server.endpoint)
        [(a, m1), (b, _)] = nodes.join(2, 2, 3, heartbeat=None)
        late = nodes.client()
        arrived: list[BaseException | None] = []
        waiter = threading.Thread(target=lambda: arrived.append(
            _raised(lambda: late.join("127.0.0.1:20098", 2, 3, timeout=20))))
        waiter.start()
        wait(lambda: any(n.role == "waiting" for n in nodes.client().status()[0].nodes),
             what="the late node waiting")
        a.leave("job complete", job_finished=True)
        [run] = nodes.client().status()
        assert run.state == Phase.ACTIVE and run.membership.generation == m1.generation
        b.leave("job complete", job_finished=True)
        waiter.join(timeout=20)
        assert isinstance(arrived[0], JobCompleteError), arrived
        [run] = nodes.client().status()
        assert run.state == Phase.COMPLETED
        assert run.reason.startswith("completed: every member left having finished the job")
        assert "generation_start" not in [h["event"] for h in run.history][-3:]
    finally:
        server.stop()


def test_a_newcomer_formed_with_members_past_training_is_told_the_job_is_complete(nodes_for):
    """A member lost after the exit barrier, before the others' leaves arrive, re-forms the
    survivors with a waiting newcomer: once a survivor leaves having finished the job, the
    newcomer's sync ends and its join again is told the job is complete (it exits 0) instead
    of waiting for a state nobody will send."""
    server = Orchestrator(settings=RunSettings(restart_completed=False)).start()
    try:
        nodes = nodes_for(server.endpoint)
        [(a, m1), (b, _)] = nodes.join(2, 2, 2, heartbeat=None)
        [newcomer], [joined] = nodes.join_async(1, 2, 2, heartbeat=None)
        a.leave("its process died after the exit barrier")
        m2 = joined.result(timeout=30)
        assert m2.generation > m1.generation and m2.node_id in m2.members
        syncing = nodes.submit(lambda: _raised(lambda: newcomer.synchronize("sync", b"", 20)))
        b.leave("job complete", job_finished=True)
        error = syncing.result(timeout=30)
        assert isinstance(error, GenerationChangedError), error
        assert "the job finished" in str(error)
        with pytest.raises(JobCompleteError, match="its members finished training"):
            newcomer.join(m2.members[m2.node_id], 2, 2, timeout=20)
        [run] = nodes.client().status()
        assert run.history[-1]["event"] == "node_left"  # b's: nothing formed after it
    finally:
        server.stop()


def _raised(call) -> BaseException | None:
    try:
        call()
    except BaseException as e:  # noqa: BLE001 - the test looks at what was raised
        return e
    return None
