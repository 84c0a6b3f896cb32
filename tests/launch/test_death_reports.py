"""The agent tells the orchestrator at once when a worker dies (no TensorFlow: the worker is
played by a client that joins with the worker's address)."""

import concurrent.futures
import sys
import threading

import pytest

from tensorflow_elastic import environment
from tensorflow_elastic.launch.in_process import InProcessElasticity
from tensorflow_elastic.launch.ports import PortAllocator
from tensorflow_elastic.launch.process import WorkerProcess
from tensorflow_elastic.launch.spec import WorkerSpec
from tensorflow_elastic.membership import node_file
from tensorflow_elastic.rendezvous import Client, Orchestrator
from tensorflow_elastic.rendezvous.types import NodeBounds


def _address(elasticity: InProcessElasticity, slot: int) -> str:
    """The address the agent gives the slot's worker (the test's client plays the worker)."""
    launch = elasticity.launch(slot)
    for held in launch.sockets:
        held.close()
    return launch.env[environment.ADDRESS]


@pytest.fixture
def agent():
    """An in-process agent's view of a job on an embedded orchestrator, and a maker of clients
    (closed at the end) that play its workers and their peers."""
    clients = []

    def client() -> Client:
        clients.append(Client(server.endpoint, "job"))
        return clients[-1]

    with Orchestrator("127.0.0.1", 0) as server:
        spec = WorkerSpec("train.py", [], server.endpoint, "job", NodeBounds(1, 3))
        elasticity = InProcessElasticity(spec, PortAllocator("127.0.0.1"),
                                         hosts_orchestrator=False)
        try:
            yield elasticity, client
        finally:
            for made in clients:
                made.close()
            elasticity.close()


def _join_both(survivor: Client, dying: Client, address: str):
    """Both nodes in generation 1 (the dying one at the worker's address); its membership."""
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        joins = [pool.submit(survivor.join, "127.0.0.1:20001", 1, 3, timeout=10),
                 pool.submit(dying.join, address, 1, 3, timeout=10)]
        return joins[1].result(timeout=30)


def test_the_agent_reports_its_dead_worker_s_node_and_the_members_move_on(agent):
    elasticity, client = agent
    survivor, dying = client(), client()
    first = _join_both(survivor, dying, _address(elasticity, 0))
    assert sorted(first.members) == sorted([survivor.node_id, dying.node_id])
    elasticity.report_death(0, "killed by SIGKILL")
    after = survivor.join(timeout=10)
    assert after.generation > first.generation
    assert sorted(after.members) == [survivor.node_id]


def test_the_agent_reports_its_dead_standby_worker_at_once(agent):
    """A worker that registered (it builds its model while the members train) and died before it
    asked to join: removed at once, not at its heartbeat timeout."""
    elasticity, client = agent
    member, standby = client(), client()
    member.join("127.0.0.1:20001", 1, 3, timeout=10)
    standby.register(_address(elasticity, 0), 1, 3)
    [run] = member.status()
    assert (standby.node_id, "registered") in [(n.node_id, n.role) for n in run.nodes]
    elasticity.report_death(0, "killed by SIGKILL")
    [run] = member.status()
    assert [n.node_id for n in run.nodes] == [member.node_id]
    assert any("its process died: killed by SIGKILL" in h["detail"] for h in run.history)


def test_a_worker_that_dies_before_it_registers_is_not_reported(agent):
    elasticity, _ = agent
    elasticity.report_death(0, "exit code 1")  # nothing to report, and no error
    assert elasticity.observe().node_ids[0] is None


def test_the_agent_is_woken_the_moment_a_worker_exits():
    exited = threading.Event()
    worker = WorkerProcess([sys.executable, "-c", "pass"], {}, "", lambda: "worker 0",
                           on_exit=exited.set)
    assert exited.wait(30)
    assert worker.wait_output() == 0


def test_a_worker_tells_the_agent_its_id_and_generation_and_no_status_is_asked(agent):
    """The worker writes its id to the file the agent named (membership/node_file.py): the agent
    reports its death with no look-up at the orchestrator."""
    elasticity, client = agent
    survivor, dying = client(), client()
    launch = elasticity.launch(0)
    for held in launch.sockets:
        held.close()
    first = _join_both(survivor, dying, launch.env[environment.ADDRESS])
    node_file.write(launch.env[environment.NODE_FILE],
                    node_file.NodeRecord(dying.node_id, first.generation, 2))

    def no_status():
        raise AssertionError("the agent asked the orchestrator for an id it was told")

    elasticity._status_client.status = no_status
    view = elasticity.observe()
    assert (view.node_ids[0], view.generation, view.world_size) == \
        (dying.node_id, first.generation, 2)
    assert elasticity.report_death(0, "killed by SIGKILL") == dying.node_id
    assert sorted(survivor.join(timeout=10).members) == [survivor.node_id]


def test_a_torn_or_foreign_node_file_counts_as_none(tmp_path):
    path = str(tmp_path / "node")
    for text in ('{"node_id": 3', '{"node_id": -1, "generation": 0, "world_size": 0}',
                 '{"node_id": "3", "generation": 0, "world_size": 0}', '[1, 2, 3]',
                 '{"node_id": 3, "generation": 0, "world_size": 0, "finished": 1}'):
        with open(path, "w") as f:
            f.write(text)
        assert node_file.read(path) is None
    assert node_file.read(str(tmp_path / "missing")) is None
    node_file.write(path, node_file.NodeRecord(3, 7, 2))
    assert node_file.read(path) == node_file.NodeRecord(3, 7, 2)
