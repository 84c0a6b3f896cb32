"""Join replies at a large formation: the member map once per process (joins that ask for the
map's name alone), silences counted from a newcomer's first beat after its reply was sent,
and the slower beats a large run asks for."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest

from tensorflow_elastic.observability.events import EventLog
from tensorflow_elastic.proto import rendezvous_pb2 as pb
from tensorflow_elastic.proto import rendezvous_pb2_grpc as pb_grpc
from tensorflow_elastic.rendezvous import Client, member_deltas
from tensorflow_elastic.rendezvous import run as run_module
from tensorflow_elastic.rendezvous import settings as settings_module
from tensorflow_elastic.rendezvous.metrics import Metrics
from tensorflow_elastic.rendezvous.server import Orchestrator
from tensorflow_elastic.rendezvous.service import RendezvousService
from tensorflow_elastic.rendezvous.settings import RunSettings
from tensorflow_elastic.rendezvous.store import MemoryStore
from tests.rendezvous.conftest import CallContext


def _join(stub, port: int, **fields) -> pb.JoinResponse:
    return stub.Join(pb.JoinRequest(run_id="job", address=f"127.0.0.1:{port}", min_nodes=3,
                                    max_nodes=3, nonce=f"n{port}", timeout_s=20, **fields),
                     timeout=30)


def test_a_join_that_omits_the_members_gets_the_maps_name_alone():
    with Orchestrator("127.0.0.1", 0, settings=RunSettings(heartbeat_timeout=5.0)) as server:
        stub = pb_grpc.RendezvousStub(grpc.insecure_channel(server.endpoint))
        replies: dict[int, pb.JoinResponse] = {}

        def join(port: int, **fields) -> None:
            replies[port] = _join(stub, port, **fields)

        # Naming a map as well changes nothing: the name alone.
        threads = [threading.Thread(target=join, args=(23000,)),
                   threading.Thread(target=join, args=(23001,), kwargs={"omit_members": True}),
                   threading.Thread(target=join, args=(23002,), kwargs={
                       "omit_members": True,
                       "known_map": pb.KnownMap(generation=1, digest=7)})]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        whole = replies[23000].membership
        assert len(whole.members) == 3 and not whole.delta
        for port in (23001, 23002):
            bare = replies[port].membership
            assert not bare.members and not bare.delta and not bare.removed
            assert (bare.generation, bare.chief_id, bare.digest) == (
                whole.generation, whole.chief_id, whole.digest)
            assert bare.digest == member_deltas.digest(dict(whole.members))
            assert replies[port].node_id in whole.members
            assert len(replies[port].SerializeToString()) < 40
        # A repeated join of the same node (its nonce) that asks for the map gets it whole.
        again = _join(stub, 23001)
        assert again.node_id == replies[23001].node_id
        assert dict(again.membership.members) == dict(whole.members)


def test_a_client_joining_without_members_keeps_no_map_and_watches_get_the_whole_one():
    with Orchestrator("127.0.0.1", 0, settings=RunSettings(heartbeat_timeout=5.0)) as server:
        clients = [Client(server.endpoint, "job") for _ in range(3)]
        got = {}

        def join(i: int) -> None:
            got[i] = clients[i].join(f"127.0.0.1:{23100 + i}", 3, 3, 20, with_members=i == 0)

        threads = [threading.Thread(target=join, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        full = got[0]
        assert len(full.members) == 3
        for i in (1, 2):
            assert got[i].members == {} and got[i].generation == full.generation
            assert got[i].chief_id == full.chief_id and got[i].node_id in full.members
            assert clients[i]._held is None  # noqa: SLF001 - nothing to name in a later call
        update = next(clients[1].watch())
        assert update.membership.members == full.members
        for c in clients:
            c.close()


async def _joined_at_once(service: RendezvousService, count: int, min_nodes: int,
                          max_nodes: int) -> list[pb.JoinResponse]:
    """``count`` newcomers join together; their replies, each noted as sent."""
    contexts = [CallContext() for _ in range(count)]
    replies = await asyncio.gather(*(service.Join(pb.JoinRequest(
        run_id="job", address=f"127.0.0.1:{23270 + i}", min_nodes=min_nodes,
        max_nodes=max_nodes, nonce=f"n{i}", timeout_s=10), context)
        for i, context in enumerate(contexts)))
    for context in contexts:
        for callback in context.done:
            callback(context)
    return [pb.JoinResponse.FromString(r) for r in replies]


def test_a_newcomers_silence_starts_at_its_first_beat_after_its_reply_was_sent():
    settings = RunSettings(heartbeat_timeout=0.3, last_call=0.0)

    async def scenario() -> tuple[list[int], list[int], list[int], list[int]]:
        service = RendezvousService(settings, MemoryStore(), EventLog(None), Metrics())
        await service.load()
        contexts = [CallContext(), CallContext()]
        await asyncio.gather(*(service.Join(pb.JoinRequest(
            run_id="job", address=f"127.0.0.1:{23200 + i}", min_nodes=2, max_nodes=2,
            nonce=f"n{i}", timeout_s=10), context) for i, context in enumerate(contexts)))
        run = service._run("job")  # noqa: SLF001
        await asyncio.sleep(1.0)  # both replies still on their way: nobody is silent
        members_while_sending = sorted(run.membership().members)
        for context in contexts:  # both replies went out; neither node has beaten yet
            for callback in context.done:
                callback(context)
        await asyncio.sleep(1.0)
        before_first_beats = sorted(run.membership().members)
        run.heartbeat(1, 1)  # node 1's first beat; node 0 beats later still
        await asyncio.sleep(0.2)
        run.heartbeat(0, 1)
        before_timeout = sorted(run.membership().members)
        await asyncio.sleep(0.6)
        after = sorted(run.membership().members)
        await service.close()
        return members_while_sending, before_first_beats, before_timeout, after

    while_sending, before_first_beats, before_timeout, after = asyncio.run(scenario())
    assert while_sending == [0, 1] and before_first_beats == [0, 1]
    assert before_timeout == [0, 1]
    # Both went silent after their first beat: removed (the run fell below min_nodes).
    assert after == []


def test_a_newcomer_that_never_beats_after_its_reply_is_removed_after_a_bounded_time(
        monkeypatch):
    monkeypatch.setattr(run_module, "FIRST_BEAT_MAX_S", 0.3)
    settings = RunSettings(heartbeat_timeout=0.3, last_call=0.0)

    async def scenario() -> tuple[list[int], list[int]]:
        service = RendezvousService(settings, MemoryStore(), EventLog(None), Metrics())
        await service.load()
        context = CallContext()
        await service.Join(pb.JoinRequest(run_id="job", address="127.0.0.1:23250", min_nodes=1,
                                          max_nodes=1, nonce="n", timeout_s=10), context)
        for callback in context.done:
            callback(context)
        run = service._run("job")  # noqa: SLF001
        await asyncio.sleep(0.4)  # past the heartbeat timeout, within the first-beat bound
        members = sorted(run.membership().members)
        await asyncio.sleep(0.6)  # past both
        after = sorted(run.membership().members)
        await service.close()
        return members, after

    assert asyncio.run(scenario()) == ([0], [])


@pytest.mark.parametrize("joins, beat_first", [(1, True), (2, False)],
                         ids=["beat-before-the-reply-was-noted", "join-retried"])
def test_a_newcomer_s_first_beat_ends_every_hold_on_it(monkeypatch, joins, beat_first):
    """The beat proves a reply arrived: its silence counts from that beat, not FIRST_BEAT_MAX_S
    after the sending was noted, even when its first beat overtook that note or its join was
    sent twice (a lost reply, the same nonce)."""
    monkeypatch.setattr(run_module, "FIRST_BEAT_MAX_S", 5.0)
    settings = RunSettings(heartbeat_timeout=0.3, last_call=0.0)

    async def scenario() -> list[int]:
        service = RendezvousService(settings, MemoryStore(), EventLog(None), Metrics())
        await service.load()
        contexts = [CallContext() for _ in range(joins)]
        for context in contexts:
            await service.Join(pb.JoinRequest(run_id="job", address="127.0.0.1:23255",
                                              min_nodes=1, max_nodes=1, nonce="n", timeout_s=10),
                               context)
        run = service._run("job")  # noqa: SLF001
        if beat_first:
            run.heartbeat(0, 1)
        for context in contexts:
            for callback in context.done:
                callback(context)
        if not beat_first:
            run.heartbeat(0, 1)
        await asyncio.sleep(1.0)  # silent since: past the heartbeat timeout
        after = sorted(run.membership().members)
        await service.close()
        return after

    assert asyncio.run(scenario()) == []


def test_a_member_that_joins_again_after_the_run_shrank_is_judged_by_the_beats_it_still_sends(
        monkeypatch):
    """Its beats keep the interval of the join that started them: the shorter one the smaller
    run's reply asks for must not shorten its allowed silence."""
    monkeypatch.setattr(settings_module, "RUN_BEATS_PER_S", 5.0)  # 4 nodes: 0.8 s; 1 node: 0.2 s
    settings = RunSettings(heartbeat_timeout=0.3, last_call=60.0)

    async def scenario() -> tuple[float, float, list[int]]:
        service = RendezvousService(settings, MemoryStore(), EventLog(None), Metrics())
        await service.load()
        first = (await _joined_at_once(service, 4, 1, 4))[0].heartbeat_interval_s
        run = service._run("job")  # noqa: SLF001
        for node in range(4):
            run.heartbeat(node, 1)
        for node in (1, 2, 3):
            await run.report_failure(node, 1, [node], "killed")
        context = CallContext()
        again = pb.JoinResponse.FromString(await service.Join(pb.JoinRequest(
            run_id="job", node_id=0, address="127.0.0.1:23270", min_nodes=1, max_nodes=4,
            last_generation=1, timeout_s=10), context))
        for callback in context.done:
            callback(context)
        for _ in range(3):  # node 0 beats at its first interval, as its beats were started
            await asyncio.sleep(first)
            run.heartbeat(0, run.membership().generation)
        members = sorted(run.membership().members)
        await service.close()
        return first, again.heartbeat_interval_s, members

    first, asked_again, members = asyncio.run(scenario())
    assert (first, asked_again) == (0.8, 0.2)
    assert members == [0]


def test_a_join_reply_asks_a_large_run_for_slower_beats():
    assert settings_module.beat_interval_floor(500) == 0.25
    assert settings_module.beat_interval_floor(100) < 0.25
    # The run's beats stay within RUN_BEATS_PER_S however large it grows.
    assert settings_module.beat_interval_floor(10_000) == 5.0
    assert settings_module.liveness_timeout(1.5, 0.25) == 1.5
    assert settings_module.liveness_timeout(1.5, 5.0) == 15.0
    with Orchestrator("127.0.0.1", 0, settings=RunSettings(heartbeat_timeout=0.3)) as server:
        with Client(f"127.0.0.1:{server.port}", "job") as client:
            client.join("127.0.0.1:23260", 1, 1, timeout=20)
            assert client.beat_interval_floor == settings_module.beat_interval_floor(1)


def test_a_large_runs_nodes_are_given_as_many_of_their_slower_intervals_to_beat(monkeypatch):
    """A run that asked its nodes for beats slower than a third of --heartbeat_timeout removes
    a silent one after BEATS_PER_TIMEOUT of those intervals, not at --heartbeat_timeout (they
    beat less often than that); a node that leaves does not shorten the others' time."""
    monkeypatch.setattr(settings_module, "RUN_BEATS_PER_S", 5.0)  # 3 nodes: every 0.6 s
    settings = RunSettings(heartbeat_timeout=0.3, last_call=60.0)  # forms when all 3 joined

    async def scenario() -> tuple[list[float], float, list[int], list[int]]:
        service = RendezvousService(settings, MemoryStore(), EventLog(None), Metrics())
        await service.load()
        intervals = [r.heartbeat_interval_s for r in await _joined_at_once(service, 3, 2, 3)]
        run = service._run("job")  # noqa: SLF001
        for node_id in range(3):
            run.heartbeat(node_id, 1)
        await run.leave(2, "done", False)
        # Two nodes would be asked for 0.4 s now; theirs is still 0.6 s.
        timeout = run.heartbeat_timeout()
        await asyncio.sleep(1.0)  # past --heartbeat_timeout, within 3 intervals of 0.6 s
        still = sorted(run.membership().members)
        await asyncio.sleep(1.2)  # past 1.8 s
        after = sorted(run.membership().members)
        await service.close()
        return intervals, timeout, still, after

    intervals, timeout, still, after = asyncio.run(scenario())
    assert intervals == [0.6, 0.6, 0.6]
    assert timeout == pytest.approx(1.8)
    assert still == [0, 1]
    assert after == []


def test_a_reply_that_never_goes_out_keeps_its_node_alive_for_a_bounded_time(monkeypatch):
    monkeypatch.setattr(run_module, "REPLY_HOLD_MAX_S", 0.3)
    settings = RunSettings(heartbeat_timeout=0.3, last_call=0.0)

    async def scenario() -> list[int]:
        service = RendezvousService(settings, MemoryStore(), EventLog(None), Metrics())
        await service.load()
        await service.Join(pb.JoinRequest(run_id="job", address="127.0.0.1:23300", min_nodes=1,
                                          max_nodes=1, nonce="n", timeout_s=10), CallContext())
        await asyncio.sleep(1.5)  # its peer never reads the reply
        members = sorted(service._run("job").membership().members)  # noqa: SLF001
        await service.close()
        return members

    assert asyncio.run(scenario()) == []
