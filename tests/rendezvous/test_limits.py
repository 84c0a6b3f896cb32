"""Bad or hostile input cannot make the orchestrator grow without bound: sizes and counts are
capped, idle runs expire, and an idle run costs no timer."""

from __future__ import annotations

import asyncio
import gc
import os
import time

import grpc
import pytest

from tensorflow_elastic.observability.events import EventLog
from tensorflow_elastic.proto import rendezvous_pb2 as pb
from tensorflow_elastic.proto import rendezvous_pb2_grpc as pb_grpc
from tensorflow_elastic.rendezvous import (Client, NodeRemovedError,
                                           Orchestrator, RendezvousError, RunSettings, service)
from tensorflow_elastic.rendezvous import cli, run_state
from tensorflow_elastic.rendezvous.metrics import Metrics
from tensorflow_elastic.rendezvous.run import Run
from tensorflow_elastic.rendezvous.run_state import Node, RunState
from tensorflow_elastic.rendezvous.store import FileStore, MemoryStore
from tensorflow_elastic.rendezvous.types import JoinEntry

from tests.conftest import wait_until


def _join(stub: pb_grpc.RendezvousStub, run_id: str = "job", **fields: object) -> pb.JoinResponse:
    request = dict(run_id=run_id, address="127.0.0.1:20001", min_nodes=1, max_nodes=2,
                   timeout_s=5, register_only=True)
    request.update(fields)
    return stub.Join(pb.JoinRequest(**request), timeout=10)


@pytest.fixture
def serve():
    """Starts in-process orchestrators with the given settings; yields (server, stub)."""
    started: list[tuple[Orchestrator, grpc.Channel]] = []

    def start(state_dir: str | None = None, **settings: object):
        server = Orchestrator(state_dir=state_dir, settings=RunSettings(**settings)).start()
        channel = grpc.insecure_channel(server.endpoint)
        started.append((server, channel))
        return server, pb_grpc.RendezvousStub(channel)

    yield start
    for server, channel in started:
        channel.close()
        server.stop()


@pytest.mark.parametrize("field", ["address", "nonce"])
def test_an_oversized_address_or_nonce_is_refused_and_creates_no_run(serve, field):
    value = {"address": lambda: "h" * service.MAX_ADDRESS + ":2222",
             "nonce": lambda: "n" * (service.MAX_NONCE + 1)}[field]()
    server, stub = serve()
    with pytest.raises(grpc.RpcError) as info:
        _join(stub, **{field: value})
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"limit is {getattr(service, 'MAX_' + field.upper())}" in info.value.details()
    assert len(info.value.details()) < 1000  # the reply does not echo the input back
    assert stub.Status(pb.StatusRequest(), timeout=10).runs == []


def test_runs_beyond_the_limit_are_refused(serve):
    server, stub = serve(max_runs=3)
    for i in range(3):
        _join(stub, f"run-{i}")
    with pytest.raises(grpc.RpcError) as info:
        _join(stub, "run-3")
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_runs" in info.value.details()
    _join(stub, "run-0")  # an existing run is served as before
    assert len(stub.Status(pb.StatusRequest(), timeout=10).runs) == 3


def _run_files(state_dir) -> list[str]:
    """The runs' header files in a state directory (not their node logs nor the lock)."""
    return [name for name in os.listdir(state_dir) if name.endswith(".run.json")]


def test_an_ended_run_expires_from_memory_and_store(serve, tmp_path):
    server, stub = serve(state_dir=str(tmp_path), run_expiry=0.5, heartbeat_timeout=30)
    with Client(server.endpoint, "done") as done, Client(server.endpoint, "busy") as busy:
        done.join("127.0.0.1:20001", 1, 1, timeout=10)
        busy.join("127.0.0.1:20002", 1, 1, timeout=10)
        assert len(_run_files(tmp_path)) == 2
        done.leave("job complete")
        wait_until(lambda: [r.run_id for r in busy.status(all_runs=True)] == ["busy"],
                   timeout=10, what="the completed run to expire")
        # Its store entry goes right after, off the serving loop.
        wait_until(lambda: len(_run_files(tmp_path)) == 1, timeout=10,
                   what="the completed run's store entry to go")
        time.sleep(1.0)
        assert busy.heartbeat().member  # a run with a live node stays
    with Client(server.endpoint, "done") as next_job:  # the run id is free for a new job
        assert next_job.join("127.0.0.1:20003", 1, 1, timeout=10).generation == 1


def test_a_run_whose_nodes_were_all_removed_expires(serve):
    server, stub = serve(run_expiry=0.5, heartbeat_timeout=0.5)
    _join(stub, "abandoned")  # registers a node that never heartbeats
    wait_until(lambda: not stub.Status(pb.StatusRequest(), timeout=10).runs, timeout=10,
               what="the abandoned run to expire")


def test_watch_streams_are_capped_per_peer_and_a_closed_one_frees_its_slot(serve):
    server, stub = serve(max_watches_per_peer=3)
    _join(stub)
    streams = [stub.Watch(pb.WatchRequest(run_id="job"), timeout=30) for _ in range(3)]
    for stream in streams:
        next(stream)
    refused = stub.Watch(pb.WatchRequest(run_id="job"), timeout=30)
    with pytest.raises(grpc.RpcError) as info:
        next(refused)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_watches_per_peer" in info.value.details()
    streams.pop().cancel()
    wait_until(lambda: _watch_opens(stub), timeout=10, what="a freed watch slot")


def _watch_opens(stub: pb_grpc.RendezvousStub) -> bool:
    stream = stub.Watch(pb.WatchRequest(run_id="job"), timeout=30)
    try:
        next(stream)
        return True
    except grpc.RpcError:
        return False
    finally:
        stream.cancel()


def _state_with_removed(count: int) -> RunState:
    """A run whose nodes 0..count-1 were given out and removed, in that order."""
    state = RunState.new("job", 1, 2, RunSettings())
    for node_id in range(count):
        state.add_node(Node(node_id, f"127.0.0.1:{20000 + node_id}", f"n{node_id}"))
        state.next_id = node_id + 1
        state.remove_node(node_id, "left")
    return state


def test_removed_nodes_kept_are_bounded_and_a_pruned_one_is_still_removed():
    state = _state_with_removed(run_state.MAX_REMOVED_KEPT + 10)
    assert len(state.removed) == run_state.MAX_REMOVED_KEPT and 0 not in state.removed
    assert state.was_removed(0) and state.was_removed(run_state.MAX_REMOVED_KEPT + 9)
    assert not state.was_removed(run_state.MAX_REMOVED_KEPT + 10)  # never given out
    assert "no longer kept" in state.removal_cause(0)


def test_a_node_whose_removal_was_pruned_is_told_it_was_removed():
    state = _state_with_removed(run_state.MAX_REMOVED_KEPT + 1)
    run = Run(state, RunSettings(), MemoryStore(), EventLog(None), Metrics())
    with pytest.raises(NodeRemovedError) as info:
        run.heartbeat(0, 0)
    assert "node 0 was removed" in info.value.message
    with pytest.raises(RendezvousError) as info:
        run.heartbeat(run_state.MAX_REMOVED_KEPT + 1, 0)
    assert "never given out" in info.value.message


def test_an_idle_run_wakes_no_timer():
    async def main() -> int:
        run = Run(RunState.new("job", 1, 2, RunSettings()), RunSettings(), MemoryStore(),
                  EventLog(None), Metrics())
        wakes = []
        run._on_timers = wakes.append  # noqa: SLF001 - counts the timer's rounds
        run.start()
        await asyncio.sleep(2.5)
        await run.close()
        return len(wakes)

    assert asyncio.run(main()) <= 1


def test_a_broken_watch_of_a_member_removed_below_min_wakes_no_timer():
    async def main() -> int:
        settings = RunSettings(heartbeat_timeout=60, watch_loss_grace=0.3)
        run = Run(RunState.new("job", 2, 2, settings), settings, MemoryStore(), EventLog(None),
                  Metrics())
        run.start()
        a, b = [m.node_id for m in await run.join_many(
            [JoinEntry(f"127.0.0.1:{2000 + i}", None, 0, f"n{i}", 10) for i in range(2)])]
        watch = run.watch(b)
        await watch.__anext__()
        await watch.aclose()  # b's process died: its watch broke
        await run.report_failure(b, run.generation, [b], "killed")  # below min: forming
        wakes = []
        run._on_timers = lambda *now: wakes.append(now)  # noqa: SLF001 - counts the rounds
        run._timer_wake.set()  # noqa: SLF001
        await asyncio.sleep(1.0)
        await run.close()
        return len(wakes)

    assert asyncio.run(main()) <= 2  # not one round a millisecond until the run re-forms


def test_a_status_reply_too_large_is_cut_to_fit_with_a_note():
    nodes = [pb.NodeStatus(node_id=i, address="h" * 250 + ":2222", role="waiting")
             for i in range(20_000)]
    history = [pb.HistoryEntry(event="node_left", detail="d" * 1000) for _ in range(2_000)]
    reply = pb.StatusResponse(runs=[pb.RunStatus(run_id=f"run-{i}", nodes=nodes, history=history)
                                    for i in range(2)])
    assert reply.ByteSize() > service.MAX_REPLY_BYTES
    service.fit_status(reply)
    assert 0 < reply.ByteSize() <= service.MAX_REPLY_BYTES
    for run in reply.runs:
        assert run.nodes and run.history[-1].event == "truncated"
        assert "left out" in run.history[-1].detail


def test_barriers_and_exchanges_of_one_generation_are_capped(serve):
    server, _ = serve(max_gathers=3)
    with Client(server.endpoint, "job", retry_timeout=1) as member:
        member.join("127.0.0.1:20001", 1, 1, timeout=10)
        member.start_heartbeats(0.25)
        for name in ("a", "b", "c"):
            member.barrier(name, timeout=5)
        member.barrier("a", timeout=5)  # a retry of a held one is not a new gather
        with pytest.raises(RendezvousError) as info:
            member.barrier("d", timeout=5)
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max_gathers" in info.value.message


def test_probes_of_reported_peers_are_bounded(monkeypatch):
    """A burst of reports must not open a connection per peer at once (file descriptors)."""
    from tensorflow_elastic.net import Probe
    from tensorflow_elastic.rendezvous import run as run_module

    active, most = 0, 0

    async def slow_probe(address, timeout):
        nonlocal active, most
        active += 1
        most = max(most, active)
        await asyncio.sleep(0.01)
        active -= 1
        return Probe.UNKNOWN

    monkeypatch.setattr(run_module, "probe", slow_probe)

    async def main() -> list[bool]:
        run = Run(RunState.new("job", 1, 2, RunSettings()), RunSettings(), MemoryStore(),
                  EventLog(None), Metrics())
        return await asyncio.gather(*(run._is_dead(peer, f"127.0.0.1:{20000 + peer}")
                                      for peer in range(100)))

    verdicts = asyncio.run(main())
    assert most == run_module.MAX_CONCURRENT_PROBES
    assert not any(verdicts), "a probe that says nothing of the peer keeps it"


def test_the_orchestrator_command_collects_garbage_for_a_long_lived_server():
    # At 10,000 nodes a scan of every object the process holds took 0.3-0.5 s of the serving
    # loop, several times a formation: the command's process freezes what start-up loaded and
    # collects young objects less often, so those scans come far less often.
    threshold, frozen = gc.get_threshold(), gc.get_freeze_count()
    try:
        cli.collect_for_serving()
        assert gc.get_threshold()[0] == cli.GC_YOUNG_THRESHOLD > threshold[0]
        assert gc.get_threshold()[1:] == threshold[1:]
        assert gc.get_freeze_count() > frozen
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def test_the_service_names_a_handler_for_every_method_of_its_protocol():
    # The orchestrator registers them with gRPC one by one (a quarter less of its loop per Join
    # than one generic handler): a method left out would be unknown to every client.
    served = service.RendezvousService(RunSettings(), MemoryStore(), EventLog(None), Metrics())
    methods = pb.DESCRIPTOR.services_by_name["Rendezvous"].methods
    assert set(served.method_handlers()) == {method.name for method in methods}
