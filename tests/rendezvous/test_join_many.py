"""Several joins in one call (JoinMany), as a launcher joins the nodes of its workers: each entry
is a join of its own (checks, nonce, hold), answered in order; the batch's size is bounded."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tensorflow_elastic.observability.events import EventLog
from tensorflow_elastic.proto import rendezvous_pb2 as pb
from tensorflow_elastic.proto import rendezvous_pb2_grpc as pb_grpc
from tensorflow_elastic.rendezvous import (Client, InvalidArgumentError, Membership,
                                           RendezvousError)
from tensorflow_elastic.rendezvous import run as run_module
from tensorflow_elastic.rendezvous.client import join_together
from tensorflow_elastic.rendezvous.metrics import Metrics
from tensorflow_elastic.rendezvous.server import Orchestrator
from tensorflow_elastic.rendezvous.service import RendezvousService
from tensorflow_elastic.rendezvous.settings import MAX_JOINS_PER_CALL, RunSettings
from tensorflow_elastic.rendezvous.store import MemoryStore
from tests.rendezvous.conftest import CallContext

_SETTINGS = RunSettings(heartbeat_timeout=5.0)


def _entry(port: int, nodes: int = 3, timeout_s: float = 20, **fields) -> pb.JoinRequest:
    return pb.JoinRequest(run_id="job", address=f"127.0.0.1:{port}", min_nodes=nodes,
                          max_nodes=nodes, nonce=f"n{port}", timeout_s=timeout_s, **fields)


def _members(server: Orchestrator) -> list[int]:
    stub = pb_grpc.RendezvousStub(grpc.insecure_channel(server.endpoint))
    runs = stub.Status(pb.StatusRequest(run_id="job"), timeout=10).runs
    return sorted(runs[0].membership.members)


def test_nodes_joined_in_one_call_form_a_generation_and_the_first_alone_gets_the_map():
    with Orchestrator("127.0.0.1", 0, settings=_SETTINGS) as server:
        stub = pb_grpc.RendezvousStub(grpc.insecure_channel(server.endpoint))
        reply = stub.JoinMany(pb.JoinManyRequest(joins=[
            _entry(23400), _entry(23401, omit_members=True), _entry(23402, omit_members=True)]),
            timeout=30)
        answers = list(reply.answers)
        assert [a.HasField("reply") for a in answers] == [True, True, True]
        ids = [a.reply.node_id for a in answers]
        whole = answers[0].reply.membership
        assert sorted(ids) == sorted(whole.members) == [0, 1, 2]
        assert dict(whole.members)[ids[1]] == "127.0.0.1:23401"  # each answer is its entry's
        for answer in answers[1:]:
            bare = answer.reply.membership
            assert not bare.members and (bare.generation, bare.digest) == (1, whole.digest)
        assert _members(server) == [0, 1, 2]


def test_a_reply_holds_one_member_map_per_run_however_many_entries_ask_for_it():
    with Orchestrator("127.0.0.1", 0, settings=_SETTINGS) as server:
        stub = pb_grpc.RendezvousStub(grpc.insecure_channel(server.endpoint))
        other_run = [_entry(23410 + i, nodes=2) for i in range(2)]
        for entry in other_run:
            entry.run_id = "job2"
        reply = stub.JoinMany(pb.JoinManyRequest(joins=[
            _entry(23405), other_run[0], _entry(23406), _entry(23407), other_run[1]]),
            timeout=30)
        maps = [len(answer.reply.membership.members) for answer in reply.answers]
        assert maps == [3, 2, 0, 0, 0]
        digests = [answer.reply.membership.digest for answer in reply.answers]
        assert digests[0] == digests[2] == digests[3] and digests[1] == digests[4]


def test_clients_joined_together_know_their_nodes_and_join_the_next_generation_together():
    with Orchestrator("127.0.0.1", 0, settings=_SETTINGS) as server:
        clients = [Client(server.endpoint, "job") for _ in range(3)]
        try:
            for i, c in enumerate(clients):
                c.bind(f"127.0.0.1:{23410 + i}", 3, 3)
            first = join_together(clients, timeout=20)
            assert all(isinstance(m, Membership) for m in first)
            assert [m.node_id for m in first] == [c.node_id for c in clients]
            assert sorted(first[0].members) == sorted(c.node_id for c in clients)
            assert first[1].members == {} and first[1].generation == 1
            # Members re-joining their generation together end it: the next one, with all three.
            again = join_together(clients, timeout=20)
            assert [m.generation for m in again] == [2, 2, 2]
            assert [m.node_id for m in again] == [m.node_id for m in first]
            assert sorted(again[0].members) == sorted(first[0].members)
        finally:
            for c in clients:
                c.close()


@pytest.mark.parametrize("count", [0, MAX_JOINS_PER_CALL + 1], ids=["empty", "oversized"])
def test_a_batch_of_no_joins_or_of_too_many_is_refused_whole(count):
    with Orchestrator("127.0.0.1", 0, settings=_SETTINGS) as server:
        stub = pb_grpc.RendezvousStub(grpc.insecure_channel(server.endpoint))
        with pytest.raises(grpc.RpcError) as raised:
            stub.JoinMany(pb.JoinManyRequest(joins=[_entry(30000 + i, nodes=count)
                                                    for i in range(count)]), timeout=30)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"{count} joins in one JoinMany call; send 1 to {MAX_JOINS_PER_CALL}" in (
            raised.value.details())
        assert stub.Status(pb.StatusRequest(), timeout=10).runs == []  # nobody joined


def test_a_bad_entry_gets_its_error_and_the_others_join():
    with Orchestrator("127.0.0.1", 0, settings=_SETTINGS) as server:
        stub = pb_grpc.RendezvousStub(grpc.insecure_channel(server.endpoint))
        bad = _entry(23421, nodes=2)
        bad.address = "no-port"
        reply = stub.JoinMany(pb.JoinManyRequest(joins=[
            _entry(23420, nodes=2), bad, _entry(23422, nodes=2)]), timeout=30)
        good, refused, other = reply.answers
        assert not refused.HasField("reply")
        assert refused.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert "'no-port' is not HOST:PORT" in refused.message and refused.reason
        assert sorted([good.reply.node_id, other.reply.node_id]) == _members(server) == [0, 1]
        # The client turns the refused entry into its error class.
        clients = [Client(server.endpoint, "job2") for _ in range(2)]
        try:
            clients[0].bind("127.0.0.1:23423", 1, 1)
            clients[1].bind("nowhere", 1, 1)
            joined, error = join_together(clients, timeout=20)
            assert isinstance(joined, Membership) and joined.node_id == clients[0].node_id
            assert isinstance(error, InvalidArgumentError) and clients[1].node_id is None
        finally:
            for c in clients:
                c.close()


def test_each_entry_is_checked_though_alike_entries_share_their_runs_checks():
    with Orchestrator("127.0.0.1", 0, settings=_SETTINGS) as server:
        stub = pb_grpc.RendezvousStub(grpc.insecure_channel(server.endpoint))
        long_nonce, no_time, other_size = (_entry(23431, nodes=2), _entry(23432, nodes=2),
                                           _entry(23433, nodes=3))
        long_nonce.nonce = "n" * 65
        no_time.timeout_s = 0
        reply = stub.JoinMany(pb.JoinManyRequest(joins=[
            _entry(23430, nodes=2), long_nonce, no_time, other_size, _entry(23434, nodes=2)]),
            timeout=30)
        first, *refused, last = reply.answers
        assert [answer.HasField("reply") for answer in refused] == [False] * 3
        assert [answer.code for answer in refused] == [
            grpc.StatusCode.INVALID_ARGUMENT.value[0]] * 2 + [
            grpc.StatusCode.FAILED_PRECONDITION.value[0]]
        assert "nonce is 65 characters" in refused[0].message
        assert "timeout_s=0" in refused[1].message
        assert "max_nodes=2 but this node asks for 3:3" in refused[2].message
        assert sorted([first.reply.node_id, last.reply.node_id]) == _members(server) == [0, 1]


def test_a_batch_past_max_nodes_forms_with_its_first_entries_and_the_rest_wait():
    with Orchestrator("127.0.0.1", 0, settings=_SETTINGS) as server:
        stub = pb_grpc.RendezvousStub(grpc.insecure_channel(server.endpoint))
        reply = stub.JoinMany(pb.JoinManyRequest(joins=[
            _entry(23440 + i, nodes=2, timeout_s=1.0) for i in range(3)]), timeout=30)
        first, second, third = reply.answers
        assert [first.reply.node_id, second.reply.node_id] == _members(server) == [0, 1]
        assert first.reply.membership.generation == 1
        assert not third.HasField("reply") and "waiting" in third.message


def test_a_retried_batch_keeps_its_nodes_by_their_nonces():
    with Orchestrator("127.0.0.1", 0, settings=_SETTINGS) as server:
        stub = pb_grpc.RendezvousStub(grpc.insecure_channel(server.endpoint))
        request = pb.JoinManyRequest(joins=[_entry(23430, nodes=2),
                                            _entry(23431, nodes=2, omit_members=True)])
        first = stub.JoinMany(request, timeout=30)
        retried = stub.JoinMany(request, timeout=30)  # as a client whose reply was lost
        ids = [a.reply.node_id for a in first.answers]
        assert [a.reply.node_id for a in retried.answers] == ids
        assert [a.reply.membership.generation for a in retried.answers] == [1, 1]
        assert _members(server) == sorted(ids) == [0, 1]


def test_a_reply_with_another_count_of_answers_than_joins_is_an_error(monkeypatch):
    clients = [Client("127.0.0.1:1", "job") for _ in range(3)]
    for k, client in enumerate(clients):
        client.bind(f"127.0.0.1:{23480 + k}", 3, 3)
    monkeypatch.setattr(Client, "_call", lambda *_: pb.JoinManyResponse(answers=[
        pb.JoinAnswer(code=grpc.StatusCode.UNAVAILABLE.value[0], message="x")] * 2))
    try:
        with pytest.raises(RendezvousError, match="answered 2 of the 3 joins"):
            join_together(clients, timeout=5)
    finally:
        for client in clients:
            client.close()


def test_an_orchestrator_without_the_batched_call_gets_one_join_per_node(monkeypatch):
    handlers = RendezvousService.method_handlers

    def without_join_many(self: RendezvousService) -> dict:
        return {name: h for name, h in handlers(self).items() if name != "JoinMany"}

    monkeypatch.setattr(RendezvousService, "method_handlers", without_join_many)
    with Orchestrator("127.0.0.1", 0, settings=_SETTINGS) as server:
        clients = [Client(server.endpoint, "job") for _ in range(2)]
        try:
            for i, c in enumerate(clients):
                c.bind(f"127.0.0.1:{23440 + i}", 2, 2)
            joined = join_together(clients, timeout=20)
            assert [m.node_id for m in joined] == [c.node_id for c in clients]
            assert sorted(joined[0].members) == _members(server) == [0, 1]
            assert joined[1].members == {}
        finally:
            for c in clients:
                c.close()


def test_nodes_joined_in_one_call_are_held_until_their_reply_is_sent_then_their_first_beat(
        monkeypatch):
    monkeypatch.setattr(run_module, "FIRST_BEAT_MAX_S", 0.5)
    settings = RunSettings(heartbeat_timeout=0.3, last_call=0.0)

    async def scenario() -> tuple[list[int], list[int], list[int]]:
        service = RendezvousService(settings, MemoryStore(), EventLog(None), Metrics())
        await service.load()
        context = CallContext()
        await service.JoinMany(pb.JoinManyRequest(joins=[
            _entry(23450 + i, nodes=2, timeout_s=10) for i in range(2)]), context)
        run = service._run("job")  # noqa: SLF001
        await asyncio.sleep(1.0)  # the reply is still on its way: nobody is silent
        while_sending = sorted(run.membership().members)
        for callback in context.done:
            callback(context)
        run.heartbeat(1, 1)  # node 1 beats; node 0 never does
        await asyncio.sleep(0.2)
        run.heartbeat(1, 1)
        within_bound = sorted(run.membership().members)
        await asyncio.sleep(0.8)  # past node 0's first-beat bound
        after = sorted(run.membership().members)
        await service.close()
        return while_sending, within_bound, after

    while_sending, within_bound, after = asyncio.run(scenario())
    assert while_sending == [0, 1] and within_bound == [0, 1]
    assert after == []  # node 0 removed: the run fell below min_nodes


def test_a_batch_counts_once_as_join_many_and_each_of_its_joins_as_a_join():
    metrics = Metrics()

    async def scenario() -> None:
        service = RendezvousService(RunSettings(), MemoryStore(), EventLog(None), metrics)
        await service.load()
        bad = _entry(23461, nodes=3)
        bad.address = "no-port"
        await service.JoinMany(pb.JoinManyRequest(joins=[
            _entry(23460, nodes=3), bad, _entry(23462, nodes=3), _entry(23463, nodes=3)]),
            CallContext())
        await service.close()

    asyncio.run(scenario())
    count = metrics.registry.get_sample_value
    assert count("tfelastic_rpcs_total", {"method": "JoinMany", "code": "OK"}) == 1
    assert count("tfelastic_rpcs_total", {"method": "Join", "code": "OK"}) == 3
    assert count("tfelastic_rpcs_total", {"method": "Join", "code": "INVALID_ARGUMENT"}) == 1


def test_each_entry_of_a_batch_gets_the_map_it_asked_for():
    """The batch's one whole map goes to the entry that asked for it, whatever comes before
    it; the others get its name (the batch encodes each kind once)."""
    async def scenario() -> list[pb.Membership]:
        service = RendezvousService(_SETTINGS, MemoryStore(), EventLog(None), Metrics())
        await service.load()
        unknown = pb.KnownMap(generation=7, digest=12345)  # a map never sent: the whole map
        reply = pb.JoinManyResponse.FromString(await service.JoinMany(pb.JoinManyRequest(joins=[
            _entry(23470, nodes=4, omit_members=True), _entry(23471, nodes=4, known_map=unknown),
            _entry(23472, nodes=4, omit_members=True), _entry(23473, nodes=4)]), CallContext()))
        await service.close()
        return [answer.reply.membership for answer in reply.answers]

    bare, whole, *others = asyncio.run(scenario())
    assert sorted(whole.members) == [0, 1, 2, 3] and not whole.delta
    for name in (bare, *others):
        assert not name.members and (name.generation, name.digest) == (1, whole.digest)
