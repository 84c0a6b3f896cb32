"""The agent tells the orchestrator at once when a worker dies (no TensorFlow: the worker is
played by a client that joins with the worker's address)."""

import concurrent.futures
import sys
import threading

from tensorflow_elastic import environment
from tensorflow_elastic.launch.in_process import InProcessElasticity
from tensorflow_elastic.launch.ports import PortAllocator
from tensorflow_elastic.launch.process import WorkerProcess
from tensorflow_elastic.launch.spec import WorkerSpec
from tensorflow_elastic.rendezvous import Client, Orchestrator


def _address(elasticity: InProcessElasticity, slot: int) -> str:
    """The address the agent gives the slot's worker (the test's client plays the worker)."""
    launch = elasticity.launch(slot)
    for held in launch.sockets:
        held.close()
    return launch.env[environment.ADDRESS]


def test_the_agent_reports_its_dead_worker_s_node_and_the_members_move_on():
    with Orchestrator("127.0.0.1", 0) as server:
        spec = WorkerSpec("train.py", [], server.endpoint, "job", 1, 3)
        elasticity = InProcessElasticity(spec, PortAllocator("127.0.0.1"),
                                         hosts_orchestrator=False)
        survivor, dying = Client(server.endpoint, "job"), Client(server.endpoint, "job")
        try:
            address = _address(elasticity, 0)
            with concurrent.futures.ThreadPoolExecutor(2) as pool:  # both in generation 1
                joins = [pool.submit(survivor.join, "127.0.0.1:20001", 1, 3, timeout=10),
                         pool.submit(dying.join, address, 1, 3, timeout=10)]
                first = joins[1].result(timeout=30)
            assert sorted(first.members) == sorted([survivor.node_id, dying.node_id])
            elasticity.report_death(0, "killed by SIGKILL")
            after = survivor.join(timeout=10)
            assert after.generation > first.generation
            assert sorted(after.members) == [survivor.node_id]
        finally:
            for client in (survivor, dying):
                client.close()
            elasticity.close()


def test_the_agent_reports_its_dead_standby_worker_at_once():
    """A worker that registered (it builds its model while the members train) and died before it
    asked to join: removed at once, not at its heartbeat timeout."""
    with Orchestrator("127.0.0.1", 0) as server:
        spec = WorkerSpec("train.py", [], server.endpoint, "job", 1, 3)
        elasticity = InProcessElasticity(spec, PortAllocator("127.0.0.1"),
                                         hosts_orchestrator=False)
        member, standby = Client(server.endpoint, "job"), Client(server.endpoint, "job")
        try:
            member.join("127.0.0.1:20001", 1, 3, timeout=10)
            standby.register(_address(elasticity, 0), 1, 3)
            [run] = member.status()
            assert (standby.node_id, "registered") in [(n.node_id, n.role) for n in run.nodes]
            elasticity.report_death(0, "killed by SIGKILL")
            [run] = member.status()
            assert [n.node_id for n in run.nodes] == [member.node_id]
            assert any("its process died: killed by SIGKILL" in h["detail"] for h in run.history)
        finally:
            for client in (member, standby):
                client.close()
            elasticity.close()


def test_a_worker_that_dies_before_it_registers_is_not_reported():
    with Orchestrator("127.0.0.1", 0) as server:
        spec = WorkerSpec("train.py", [], server.endpoint, "job", 1, 3)
        elasticity = InProcessElasticity(spec, PortAllocator("127.0.0.1"),
                                         hosts_orchestrator=False)
        try:
            elasticity.report_death(0, "exit code 1")  # nothing to report, and no error
            assert elasticity.observe().node_ids[0] is None
        finally:
            elasticity.close()


def test_the_agent_is_woken_the_moment_a_worker_exits():
    exited = threading.Event()
    worker = WorkerProcess([sys.executable, "-c", "pass"], {}, "", lambda: "worker 0",
                           on_exit=exited.set)
    assert exited.wait(30)
    assert worker.wait_output() == 0
