"""The runtime's checks that need no cluster (a stand-in client; the rest runs in tests/strategy)."""

import os
import socket

import pytest

from tensorflow_elastic import runtime
from tensorflow_elastic.agent import ports
from tensorflow_elastic.errors import ElasticJobFailed
from tensorflow_elastic.rendezvous import Membership
from tensorflow_elastic.rendezvous.errors import GenerationChangedError


class _UnusedClient:
    """The checks below never talk to the orchestrator."""


@pytest.fixture
def job(monkeypatch):
    rt = runtime.ElasticRuntime(_UnusedClient(), "127.0.0.1:1", min_nodes=2, max_nodes=4)
    monkeypatch.setattr(runtime, "_runtime", rt)
    return rt


def test_matching_or_omitted_bounds_return_the_runtime(job):
    assert runtime.ensure_initialized() is job
    assert runtime.ensure_initialized(min_nodes=2, max_nodes=4) is job


@pytest.mark.parametrize("bounds, name", [((3, None), "min_nodes=3"), ((None, 5), "max_nodes=5")])
def test_contradicting_bounds_are_refused(job, bounds, name):
    with pytest.raises(ValueError, match=rf"{name} differs from the job's"):
        runtime.ensure_initialized(*bounds)


@pytest.mark.parametrize("bounds", [(0, 2), (3, 2)])
def test_bad_bounds_are_refused(bounds):
    with pytest.raises(ValueError, match="min_nodes <= max_nodes"):
        runtime.ElasticRuntime(_UnusedClient(), "127.0.0.1:1", *bounds)


def test_waiting_nodes_trigger_a_reform_only_below_max_nodes(job):
    from tensorflow_elastic.rendezvous import Membership

    job.membership = Membership(0, 1, {0: "a", 1: "b"}, 0)
    assert not job.wants_reform()
    job._waiting = 1
    assert job.wants_reform()
    job.membership = Membership(0, 2, {0: "a", 1: "b", 2: "c", 3: "d"}, 0)
    assert not job.wants_reform()  # already max_nodes: nobody more can come in


def test_a_leave_request_is_a_vote_to_reform(job):
    job.request_leave()
    assert job.wants_reform() and job.leave_requested


class _BarrierClient:
    """Records barriers and whether the runtime was re-forming during each; can fail one."""

    def __init__(self, runtime_of, error=None):
        self.runtime_of = runtime_of
        self.error = error
        self.barriers = []

    def barrier(self, name, timeout):
        self.barriers.append((name, self.runtime_of()._reforming.is_set()))
        if self.error is not None:
            raise self.error


def _member_of_generation_7(barrier_error=None):
    rt = runtime.ElasticRuntime(_UnusedClient(), "127.0.0.1:1", min_nodes=2, max_nodes=4)
    rt.client = _BarrierClient(lambda: rt, barrier_error)
    rt.membership = Membership(0, 7, {0: "a", 1: "b"}, 0)
    return rt


def test_a_planned_change_waits_for_every_member_to_finish_the_step():
    rt = _member_of_generation_7()
    rt.finish_step_together()
    # Watch-stream news during the barrier must not abort anything or vote again.
    assert rt.client.barriers == [("change-7", True)]
    assert not rt._reforming.is_set()


def test_a_failure_while_members_finish_the_step_is_left_to_the_re_form():
    rt = _member_of_generation_7(GenerationChangedError("generation 7 ended"))
    rt.finish_step_together()
    assert rt.client.barriers == [("change-7", True)]
    assert not rt._reforming.is_set()


def test_the_reserved_port_is_held_until_the_server_takes_it():
    reservation = ports.reserve_port("127.0.0.1")
    port = reservation.getsockname()[1]
    rt = runtime.ElasticRuntime(_UnusedClient(), f"127.0.0.1:{port}", min_nodes=1, max_nodes=1,
                                address_reservation=reservation)
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", port))
    rt.release_address()
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))


def _passed_down(monkeypatch) -> tuple[str, int]:
    """A port held the way the launcher's agent hands it to a worker: (address, its port)."""
    agent_copy = ports.reserve_port("127.0.0.1")
    port = agent_copy.getsockname()[1]
    monkeypatch.setenv(runtime.ADDRESS_FD_ENV, str(os.dup(agent_copy.fileno())))
    agent_copy.close()  # the agent lets go once the worker started
    return f"127.0.0.1:{port}", port


def test_a_port_passed_down_held_stays_held_without_a_gap(monkeypatch):
    address, port = _passed_down(monkeypatch)
    kept, held = runtime._reserve(address)
    assert kept == address and held.getsockname()[1] == port
    assert runtime.ADDRESS_FD_ENV not in os.environ and not held.get_inheritable()
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", port))
    held.close()


def test_a_port_passed_down_for_another_address_is_let_go(monkeypatch):
    _, stale_port = _passed_down(monkeypatch)
    with ports.reserve_port("127.0.0.1") as probe:
        wanted = probe.getsockname()[1]
    _, held = runtime._reserve(f"127.0.0.1:{wanted}")
    assert held.getsockname()[1] == wanted
    held.close()
    with socket.socket() as other:
        other.bind(("127.0.0.1", stale_port))


def test_a_given_address_whose_port_is_taken_fails_at_init_with_the_fix(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        monkeypatch.setattr(runtime, "_runtime", None)
        with pytest.raises(ElasticJobFailed, match=f"{address} cannot be used.*free port"):
            runtime.init(endpoint="127.0.0.1:1", address=address)
