"""The etcd store and the leader election against a real etcd server (no TensorFlow)."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import threading
import time
from typing import Iterator

import grpc
import pytest

from tensorflow_elastic.proto import etcd_pb2 as epb
from tensorflow_elastic.rendezvous import cli, etcd, etcd_store
from tensorflow_elastic.rendezvous.errors import NotLeaderError, StoreLimitError
from tensorflow_elastic.rendezvous.etcd_store import EtcdStore, leader_key
from tensorflow_elastic.rendezvous.leader import Election
from tests.conftest import started_etcd, wait_until
from tests.rendezvous import test_node_log as node_log_test
from tools.etcd_server import EtcdServer

# Lease timings of a second against a real etcd: no other test process beside it
# (tests/conftest.py).
pytestmark = pytest.mark.serial

PREFIX = "/test"


@pytest.fixture(scope="module")
def etcd_server(tmp_path_factory) -> Iterator[EtcdServer]:
    """One etcd for the module (starting one was most of a test's time); ``client`` empties it
    after each test."""
    yield from started_etcd(tmp_path_factory.mktemp("etcd"))


@pytest.fixture
def client(etcd_server):
    c = etcd.EtcdClient((etcd_server.endpoint,))
    yield c
    c.txn([], [epb.RequestOp(request_delete_range=epb.DeleteRangeRequest(key=b"\0",
                                                                          range_end=b"\0"))])
    c.close()


def _elect(client, identity: str, ttl: int = 1) -> tuple[Election, threading.Event]:
    changed = threading.Event()
    election = Election(client, leader_key(PREFIX), identity, ttl, on_change=changed.set)
    election.start()
    return election, changed


def test_url_parsing():
    url = etcd.parse_url("etcd://10.0.0.1:2379,10.0.0.2:2379/jobs/a")
    assert url.endpoints == ("10.0.0.1:2379", "10.0.0.2:2379") and url.prefix == "/jobs/a"
    assert etcd.parse_url("etcd://h:1").prefix == etcd.DEFAULT_PREFIX
    assert etcd.parse_url("etcds://h:1/p").tls and not etcd.parse_url("etcd://h:1/p").tls
    for bad in ("h:1", "etcd://", "etcd://host", "etcd://h:x/p", "https://h:1"):
        with pytest.raises(ValueError, match="etcd"):
            etcd.parse_url(bad)
    assert etcd.prefix_end(b"/a") == b"/b" and etcd.prefix_end(b"a\xff") == b"b"


def test_one_leader_and_a_standby_that_takes_over(client):
    first, first_changed = _elect(client, "replica-1")
    wait_until(lambda: first.leading, timeout=10, what="the first replica to lead")
    second, _ = _elect(client, "replica-2")
    wait_until(lambda: second.leader == "replica-1", timeout=10, what="the standby to see it")
    assert not second.leading
    first.stop()  # revokes its lease: the key goes at once
    wait_until(lambda: second.leading, timeout=10, what="the standby to take over")
    assert second.previous == "replica-1"
    second.stop()


def test_saves_are_guarded_by_the_lead_and_the_revision(client):
    election, _ = _elect(client, "replica-1")
    wait_until(lambda: election.leading, timeout=10, what="the lead")
    conflicts = []
    store = EtcdStore(client, PREFIX, election, on_conflict=conflicts.append)
    store.save("job", {"run_id": "job", "next_id": 1})
    store.save("job", {"run_id": "job", "next_id": 2})
    assert EtcdStore(client, PREFIX, election).load() == {"job": {"run_id": "job", "next_id": 2,
                                                                 "nodes": []}}
    # Another writer moved the run's key on: the next save must not overwrite it.
    other = EtcdStore(client, PREFIX, election)
    other.load()
    other.save("job", {"run_id": "job", "next_id": 3})
    with pytest.raises(NotLeaderError, match="revision check failed"):
        store.save("job", {"run_id": "job", "next_id": 3})
    assert conflicts  # the server steps down on it
    assert json.loads(client.get(store._key("job")).value)["next_id"] == 3
    election.stop()


def test_a_replica_that_does_not_lead_cannot_write(client):
    leader, _ = _elect(client, "replica-1")
    wait_until(lambda: leader.leading, timeout=10, what="the lead")
    standby, _ = _elect(client, "replica-2")
    wait_until(lambda: standby.leader == "replica-1", timeout=10, what="the standby")
    with pytest.raises(NotLeaderError, match="does not lead"):
        EtcdStore(client, PREFIX, standby).save("job", {"run_id": "job"})
    # A forged revision (a replica that believes it still leads) fails the transaction.
    standby.revision = 1
    with pytest.raises(NotLeaderError, match="revision check failed"):
        EtcdStore(client, PREFIX, standby).save("job", {"run_id": "job"})
    assert client.get(EtcdStore(client, PREFIX, leader)._key("job")) is None
    leader.stop()
    standby.stop()


def test_corrupt_values_are_set_aside_and_the_others_load(client):
    election, _ = _elect(client, "replica-1")
    wait_until(lambda: election.leading, timeout=10, what="the lead")
    store = EtcdStore(client, PREFIX, election)
    store.save("good", {"run_id": "good"})
    bad_key = f"{PREFIX}/runs/garbage".encode()
    client.txn([], [etcd.put(bad_key, b"{not json")])
    client.txn([], [etcd.put(f"{PREFIX}/runs/list".encode(), b"[1, 2]")])
    assert EtcdStore(client, PREFIX, election).load() == {"good": {"run_id": "good", "nodes": []}}
    assert client.get(bad_key) is None
    assert client.get(f"{PREFIX}/corrupt/garbage".encode()).value == b"{not json"
    election.stop()


def test_a_leader_cut_off_from_etcd_stops_before_its_lease_can_end(etcd_server, client):
    election, changed = _elect(client, "replica-1", ttl=2)
    wait_until(lambda: election.leading, timeout=10, what="the lead")
    changed.clear()
    cut_at = time.monotonic()
    etcd_server.signal(signal.SIGSTOP)  # etcd answers nothing more: no renewal gets through
    try:
        wait_until(lambda: not election.leading, timeout=10, interval=0.01,
                   what="the leader to stop")
        stopped_after = time.monotonic() - cut_at
        # Its last renewal went out before the cut, so the lease lives >= 2 s from the cut on.
        assert stopped_after < 2.0 - 0.2, stopped_after
        assert changed.wait(10)  # the server hears of it once the call in flight times out
    finally:
        etcd_server.signal(signal.SIGCONT)
    wait_until(lambda: election.leading, timeout=15, what="the lead again once etcd answers")
    election.stop()


class _BlackholeProxy:
    """A TCP proxy to etcd that the test can cut: then it forwards nothing and closes nothing,
    like a network partition (no reset reaches either side)."""

    def __init__(self, target_port: int):
        self._target = ("127.0.0.1", target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.cut = threading.Event()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target)
            self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                if not self.cut.is_set():
                    sink.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self._listener.close()
        for s in self._sockets:
            s.close()


def test_a_replica_partitioned_from_etcd_stops_leading_before_another_starts(etcd_server,
                                                                            client):
    proxy = _BlackholeProxy(etcd_server.port)
    cut_off_client = etcd.EtcdClient((proxy.endpoint,), timeout=1.0)
    leader, _ = _elect(cut_off_client, "replica-1", ttl=1)
    wait_until(lambda: leader.leading, timeout=10, what="the first replica to lead")
    standby, _ = _elect(client, "replica-2", ttl=1)
    wait_until(lambda: standby.leader == "replica-1", timeout=10, what="the standby")
    times: dict[str, float] = {}

    def watch() -> None:
        while len(times) < 2:
            now = time.monotonic()
            if not leader.leading:
                times.setdefault("leader stopped", now)
            if standby.leading:
                times.setdefault("standby started", now)
            time.sleep(0.001)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    proxy.cut.set()
    watcher.join(timeout=15)
    try:
        assert times["leader stopped"] < times["standby started"], times
    finally:
        standby.stop()
        proxy.close()
        leader.stop()
        cut_off_client.close()


@pytest.mark.parametrize("flags, message", [
    (["--store", "etcd://x"], "is not HOST:PORT"),
    (["--store", "etcd://h:1", "--state_dir", "d"], "exclude each other"),
    (["--store", "etcd://h:1", "--leader_ttl", "0"], "--leader_ttl"),
    (["--store", "etcd://h:1", "--host", "0.0.0.0", "--insecure"], "give --advertise"),
    (["--store", "etcd://h:1", "--advertise", "0.0.0.0:29400"], "no address to connect to"),
    (["--store", "etcd://h:1", "--etcd_ca", "ca.pem"], "etcds://"),
    (["--store", "etcds://h:1", "--etcd_cert", "c.pem"], "go together"),
    (["--store", "etcd://h:1", "--etcd_user", "tfe"], "needs its password"),
    (["--etcd_user", "tfe"], "need an etcd store"),
])
def test_bad_store_flags_are_refused(flags, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--port", "0", *flags])
    assert e.value.code == 2 and message in capsys.readouterr().err


# ------------------------------------------------------------ sizes (etcd's limits)

def _big_snapshot(run_id: str, size: int) -> dict:
    """A snapshot holding ``size`` bytes of exchanged values that do not compress."""
    return {"run_id": run_id, "format": 1,
            "gathered": {"synchronize/state": {"0": base64.b64encode(os.urandom(size)).decode()}}}


def test_a_snapshot_over_etcd_s_request_limit_is_saved_in_parts(client):
    election, _ = _elect(client, "replica-1")
    wait_until(lambda: election.leading, timeout=10, what="the lead")
    conflicts = []
    store = EtcdStore(client, PREFIX, election, on_conflict=conflicts.append)
    big = _big_snapshot("job", 3 * 2**20)  # twice etcd's 1.5 MiB request limit
    store.save("job", big)
    store.save("job", dict(big, next_id=2))  # replaces the parts of the first save
    assert EtcdStore(client, PREFIX, election).load() == {"job": dict(big, next_id=2, nodes=[])}
    parts = f"{PREFIX}/parts/".encode()
    part_sets = {kv.key.rsplit(b"/", 2)[1] for kv in client.scan(parts, keys_only=True)}
    assert len(part_sets) == 1, part_sets  # the first save's parts went with its head
    store.save("job", {"run_id": "job", "next_id": 3})  # small again: a whole value
    assert not list(client.scan(parts, keys_only=True))
    assert EtcdStore(client, PREFIX, election).load() == {"job": {"run_id": "job", "next_id": 3,
                                                                 "nodes": []}}
    assert not conflicts and election.leading
    election.stop()


def test_parts_no_head_names_are_dropped_at_the_next_load(client):
    election, _ = _elect(client, "replica-1")
    wait_until(lambda: election.leading, timeout=10, what="the lead")
    store = EtcdStore(client, PREFIX, election)
    store.save("job", _big_snapshot("job", 2**20))
    parts = f"{PREFIX}/parts/".encode()
    named = [kv.key for kv in client.scan(parts, keys_only=True)]
    orphan = f"{PREFIX}/parts/{'0' * 64}/cut-short/000000".encode()  # a save cut short
    client.txn([], [etcd.put(orphan, b"x")])
    assert set(EtcdStore(client, PREFIX, election).load()) == {"job"}
    assert [kv.key for kv in client.scan(parts, keys_only=True)] == named
    election.stop()


def test_a_request_over_etcd_s_limit_is_a_store_limit_error_not_a_lost_lead(client,
                                                                            monkeypatch):
    with pytest.raises(etcd.EtcdRequestTooLarge, match="too large"):
        client.txn([], [etcd.put(b"/test/huge", b"x" * (2 * 2**20))])
    election, _ = _elect(client, "replica-1")
    wait_until(lambda: election.leading, timeout=10, what="the lead")
    conflicts = []
    store = EtcdStore(client, PREFIX, election, on_conflict=conflicts.append)
    # Parts over etcd's 1.5 MiB request limit, under its gRPC limit: etcd answers INVALID_ARGUMENT.
    monkeypatch.setattr(etcd_store, "PART_BYTES", 1_800_000)
    with pytest.raises(StoreLimitError, match="too large"):
        store.save("job", _big_snapshot("job", 3 * 2**20))
    assert not conflicts and election.leading  # neither unavailable nor a lost lead
    election.stop()


def test_runs_over_the_receive_limit_load_page_by_page(client):
    """Six runs of 1 MiB each (as a store without parts wrote them): one answer would pass
    gRPC's 4 MiB receive limit and no replica taking the lead could serve."""
    election, _ = _elect(client, "replica-1")
    wait_until(lambda: election.leading, timeout=10, what="the lead")
    store = EtcdStore(client, PREFIX, election)
    runs = {f"run-{i}": _big_snapshot(f"run-{i}", 768 * 1024) for i in range(6)}
    for run_id, snapshot in runs.items():
        client.txn([], [etcd.put(store._key(run_id), json.dumps(snapshot).encode())])
    assert store.load() == runs
    election.stop()


# ------------------------------------------------------------- transactions and the lead

class _AnswerLost:
    """etcd's KV stub whose first transaction is applied but answered DEADLINE_EXCEEDED."""

    def __init__(self, stub):
        self._stub = stub
        self.lost = 0

    def __getattr__(self, name):
        return getattr(self._stub, name)

    def Txn(self, request, **kwargs):  # noqa: N802 - the stub's method name
        response = self._stub.Txn(request, **kwargs)
        if not self.lost:
            self.lost += 1
            raise _DeadlineExceeded()
        return response


class _DeadlineExceeded(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self):
        return "Deadline Exceeded"


def test_a_transaction_applied_before_its_answer_was_lost_is_no_conflict(client):
    election, _ = _elect(client, "replica-1")
    wait_until(lambda: election.leading, timeout=10, what="the lead")
    conflicts = []
    store = EtcdStore(client, PREFIX, election, on_conflict=conflicts.append)
    store.save("job", {"run_id": "job", "next_id": 1})
    lossy = client._kv[0] = _AnswerLost(client._kv[0])
    store.save("job", {"run_id": "job", "next_id": 2})  # applied, then sent again
    assert lossy.lost == 1 and not conflicts and election.leading
    store.save("job", {"run_id": "job", "next_id": 3})  # the revision it read back is right
    assert EtcdStore(client, PREFIX, election).load() == {"job": {"run_id": "job", "next_id": 3,
                                                                 "nodes": []}}
    election.stop()


def test_a_deleted_leader_key_ends_the_lead(client):
    election, changed = _elect(client, "replica-1")
    wait_until(lambda: election.leading, timeout=10, what="the lead")
    changed.clear()
    client.txn([], [etcd.delete(leader_key(PREFIX))])
    assert changed.wait(5), "the leader did not notice"
    assert "deleted" in election.lost_cause
    election.stop()


def test_a_head_naming_parts_of_another_run_is_set_aside(client):
    election, _ = _elect(client, "replica-1")
    wait_until(lambda: election.leading, timeout=10, what="the lead")
    store = EtcdStore(client, PREFIX, election)
    store.save("victim", _big_snapshot("victim", 2**20))
    parts = store._part_sets["victim"].decode()
    head = {"run_id": "forged", "parts": {"prefix": parts, "count": 6, "sha256": "0"}}
    client.txn([], [etcd.put(store._key("forged"), json.dumps(head).encode())])
    assert set(EtcdStore(client, PREFIX, election).load()) == {"victim"}
    assert client.get(store._key("forged")) is None  # moved to PREFIX/corrupt/
    election.stop()


# ------------------------------------------------------------- the node log

def _node_log_keys(client) -> list[bytes]:
    return [kv.key for kv in client.scan(f"{PREFIX}/nodes/".encode(), keys_only=True)]


def test_a_run_saved_change_by_change_loads_as_it_was_on_etcd(client):
    election, _ = _elect(client, "replica-1")
    wait_until(lambda: election.leading, timeout=10, what="the lead")
    state = node_log_test.new_state()
    store = EtcdStore(client, PREFIX, election)
    # Records of ~600 bytes: the base and the formation's records go in several keys.
    node_log_test.run_a_job(node_log_test.Saver(store, state), 2000, address_bytes=500)
    loaded_store = EtcdStore(client, PREFIX, election)
    node_log_test.assert_same(node_log_test.load(loaded_store), state)
    tags = {key.rsplit(b"/", 2)[1] for key in _node_log_keys(client)}
    assert len(tags) == 1, tags  # the former bases went with the heads that replaced them
    node_log_test.join(state, 3)
    node_log_test.Saver(loaded_store, state).save()  # the loaded store goes on
    node_log_test.assert_same(node_log_test.load(EtcdStore(client, PREFIX, election)), state)
    election.stop()


def test_a_replica_written_past_cannot_touch_the_node_log_it_shares(client):
    election, _ = _elect(client, "replica-1")
    wait_until(lambda: election.leading, timeout=10, what="the lead")
    state = node_log_test.new_state()
    stale = EtcdStore(client, PREFIX, election, on_conflict=lambda cause: None)
    saver = node_log_test.Saver(stale, state)
    node_log_test.join(state, 10)
    saver.save()
    other = EtcdStore(client, PREFIX, election)
    theirs = node_log_test.load(other)
    node_log_test.join(theirs, 2)
    node_log_test.Saver(other, theirs).save()
    node_log_test.join(state, 600, address_bytes=500)  # records written before the head
    with pytest.raises(NotLeaderError, match="revision check failed"):
        saver.save()
    node_log_test.assert_same(node_log_test.load(EtcdStore(client, PREFIX, election)), theirs)
    election.stop()


def test_node_log_keys_no_head_names_are_dropped_at_the_next_load(client):
    election, _ = _elect(client, "replica-1")
    wait_until(lambda: election.leading, timeout=10, what="the lead")
    state = node_log_test.new_state()
    store = EtcdStore(client, PREFIX, election)
    node_log_test.join(state, 20)
    node_log_test.Saver(store, state).save()
    named = _node_log_keys(client)
    [tag] = {key.rsplit(b"/", 2)[1] for key in named}
    run_nodes = named[0].rsplit(b"/", 2)[0]
    # A save cut short after its records (past the head's count) and a new base cut short.
    client.txn([], [etcd.put(run_nodes + b"/" + tag + b"/%08d" % len(named), b"[[999]]"),
                    etcd.put(run_nodes + b"/cut-short/00000000", b"[]")])
    node_log_test.assert_same(node_log_test.load(EtcdStore(client, PREFIX, election)), state)
    assert _node_log_keys(client) == named
    election.stop()


def test_a_node_log_key_missing_sets_the_run_aside(client):
    election, _ = _elect(client, "replica-1")
    wait_until(lambda: election.leading, timeout=10, what="the lead")
    state = node_log_test.new_state()
    store = EtcdStore(client, PREFIX, election)
    node_log_test.join(state, 20)
    node_log_test.Saver(store, state).save()
    client.txn([], [etcd.delete(_node_log_keys(client)[0])])
    assert EtcdStore(client, PREFIX, election).load() == {}
    assert list(client.scan(f"{PREFIX}/corrupt/".encode(), keys_only=True))
    election.stop()
