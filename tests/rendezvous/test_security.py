"""Token authentication, TLS, and bad requests that must not hurt the server."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request

import grpc
import pytest

from tensorflow_elastic.proto import rendezvous_pb2 as pb
from tensorflow_elastic.proto import rendezvous_pb2_grpc as pb_grpc
from tensorflow_elastic.rendezvous import Client, RendezvousError, auth

pytestmark = [pytest.mark.multiprocess, pytest.mark.light]

TOKEN = "s3cret-token"


def test_token_rejected_without_leaking(start_orchestrator, nodes_for, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    server = start_orchestrator("--token_file", str(token_file))
    [(member, _)] = nodes_for(server.endpoint, token=TOKEN).join(1, 1, 2)
    for token in (None, "wrong", TOKEN + "x"):
        intruder = Client(server.endpoint, "job", token, retry_timeout=1)
        for call in (intruder.status, lambda: intruder.join("127.0.0.1:1", 1, 2, timeout=5)):
            with pytest.raises(RendezvousError) as e:
                call()
            assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
            assert "job" not in e.value.message and "127.0.0.1" not in e.value.message
        intruder.close()
    [run] = member.status()
    assert len(run.membership.members) == 1 and run.state == "ACTIVE"


def test_refused_calls_are_counted_by_method_and_logged_once_per_peer(start_orchestrator,
                                                                     tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    server = start_orchestrator("--token_file", str(token_file), "--metrics_port", "0")
    [metrics_url] = [line.split("metrics on ", 1)[1].strip() for line in server.output
                     if line.startswith("metrics on ")]
    with Client(server.endpoint, "job", "wrong", retry_timeout=1) as intruder:
        for call in [intruder.status] * 5 + [lambda: intruder.join("127.0.0.1:1", 1, 2, 5)] * 3:
            with pytest.raises(RendezvousError):
                call()
    with grpc.insecure_channel(server.endpoint) as channel:  # a method nobody serves
        with pytest.raises(grpc.RpcError):
            channel.unary_unary("/tensorflow_elastic.Rendezvous/Nothing")(b"", timeout=10)
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    assert 'tfelastic_rpcs_total{code="UNAUTHENTICATED",method="Status"} 5.0' in text
    assert 'tfelastic_rpcs_total{code="UNAUTHENTICATED",method="Join"} 3.0' in text
    assert 'tfelastic_rpcs_total{code="UNAUTHENTICATED",method="other"} 1.0' in text
    logged = server.wait_for_line("refused calls without the right token from 127.0.0.1")
    assert "Status" in logged or "Join" in logged
    time.sleep(0.5)
    assert sum("without the right token" in line for line in server.output) == 1


def test_tls_round_trip(start_orchestrator, tls_files):
    cert, key = tls_files
    server = start_orchestrator("--tls_cert", cert, "--tls_key", key)
    with Client(server.endpoint, "job", tls_ca=cert) as secure:
        m = secure.join("127.0.0.1:20001", 1, 1, timeout=10)
        assert m.generation == 1 and secure.heartbeat().member
    with Client(server.endpoint, "job", retry_timeout=1) as plaintext:
        with pytest.raises(RendezvousError) as e:
            plaintext.status()
        assert e.value.code == grpc.StatusCode.UNAVAILABLE


def _join(**fields):
    request = dict(run_id="job", address="127.0.0.1:20001", min_nodes=1, max_nodes=2,
                   timeout_s=5)
    request.update(fields)
    return "Join", pb.JoinRequest(**request)


BAD_REQUESTS = [
    ("empty run id", lambda m: _join(run_id=""), "INVALID_ARGUMENT", "run_id is empty"),
    ("min > max", lambda m: _join(min_nodes=3, max_nodes=2), "INVALID_ARGUMENT",
     "need 1 <= min_nodes <= max_nodes"),
    ("max < 1", lambda m: _join(min_nodes=0, max_nodes=0), "INVALID_ARGUMENT",
     "must be at least 1"),
    ("bad address", lambda m: _join(address="nohost"), "INVALID_ARGUMENT", "is not HOST:PORT"),
    ("a port of 6 digits", lambda m: _join(address="h:" + "9" * 6), "INVALID_ARGUMENT",
     "is not HOST:PORT"),
    ("no timeout", lambda m: _join(timeout_s=0), "INVALID_ARGUMENT", "must be > 0"),
    ("other nnodes", lambda m: _join(max_nodes=5), "FAILED_PRECONDITION",
     "start every launcher with the same --nnodes and --nproc_per_node"),
    ("unknown node", lambda m: ("Heartbeat", pb.HeartbeatRequest(run_id="job", node_id=99)),
     "FAILED_PRECONDITION", "never given out"),
    ("unknown run", lambda m: ("Heartbeat", pb.HeartbeatRequest(run_id="nope", node_id=0)),
     "FAILED_PRECONDITION", "has no run 'nope'"),
    ("future generation", lambda m: ("Heartbeat", pb.HeartbeatRequest(
        run_id="job", node_id=m.node_id, generation=7)), "INVALID_ARGUMENT", "does not exist yet"),
    ("stale generation", lambda m: ("Barrier", pb.BarrierRequest(
        run_id="job", node_id=m.node_id, generation=m.generation - 1, name="b", timeout_s=5)),
     "FAILED_PRECONDITION", "has ended"),
    ("empty barrier name", lambda m: ("Barrier", pb.BarrierRequest(
        run_id="job", node_id=m.node_id, generation=m.generation, timeout_s=5)),
     "INVALID_ARGUMENT", "name is empty"),
    ("oversized value", lambda m: ("Synchronize", pb.SynchronizeRequest(
        run_id="job", node_id=m.node_id, generation=m.generation, key="k",
        value=b"x" * 70_000, timeout_s=5)), "INVALID_ARGUMENT", "exceeds the 65536-byte limit"),
    ("report nobody", lambda m: ("ReportFailure", pb.ReportFailureRequest(
        run_id="job", node_id=m.node_id, generation=m.generation)), "INVALID_ARGUMENT",
     "peers is empty"),
    ("report non-member", lambda m: ("ReportFailure", pb.ReportFailureRequest(
        run_id="job", node_id=m.node_id, generation=m.generation, peers=[42])),
     "INVALID_ARGUMENT", "not a member"),
    ("oversized reason", lambda m: ("Leave", pb.LeaveRequest(
        run_id="job", node_id=m.node_id, reason="r" * 5000)), "INVALID_ARGUMENT", "the limit is"),
]


def test_bad_requests_are_refused_and_the_server_stays_up(orchestrator, nodes_for):
    nodes = nodes_for(orchestrator.endpoint)
    [(a, _), (b, _)] = nodes.join(2, 1, 2)
    a.join(timeout=10)  # generation 2, so that generation 1 is stale
    m = b.join(timeout=10)
    assert m.generation == 2
    with grpc.insecure_channel(orchestrator.endpoint) as channel:
        stub = pb_grpc.RendezvousStub(channel)
        for label, make, code, message in BAD_REQUESTS:
            method, request = make(m)
            with pytest.raises(grpc.RpcError) as e:
                getattr(stub, method)(request, timeout=10)
            assert e.value.code().name == code, label
            assert message in e.value.details(), (label, e.value.details())
    # Nothing changed: same generation, same members, both still answer.
    [run] = a.status()
    assert (run.state, run.membership.generation, run.membership.members) == (
        "ACTIVE", 2, m.members)
    assert a.heartbeat().generation == b.heartbeat().generation == 2


@pytest.mark.parametrize("fields", [dict(last_generation=3), dict(register_only=True, node_id=0)])
def test_a_refused_first_join_creates_no_run(orchestrator, nodes_for, fields):
    with grpc.insecure_channel(orchestrator.endpoint) as channel:
        with pytest.raises(grpc.RpcError) as e:
            pb_grpc.RendezvousStub(channel).Join(_join(**fields)[1], timeout=10)
    assert e.value.code() in (grpc.StatusCode.INVALID_ARGUMENT,
                              grpc.StatusCode.FAILED_PRECONDITION)
    assert nodes_for(orchestrator.endpoint).client().status(all_runs=True) == []


def _orchestrator_exits(*flags: str) -> subprocess.CompletedProcess:
    """Runs tfelastic-orchestrator with `flags` and `--port 0` until it exits (or 20 s)."""
    try:
        return subprocess.run([sys.executable, "-m", "tensorflow_elastic.rendezvous", "--port", "0",
                               *flags], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(e.cmd, None, e.stdout or "", e.stderr or "")


def test_every_interface_without_a_token_is_refused(tmp_path):
    out = _orchestrator_exits("--host", "0.0.0.0")
    assert out.returncode == 2
    assert "without a token" in out.stderr and "--insecure" in out.stderr


def _first_two_lines(*flags: str) -> list[str]:
    """What tfelastic-orchestrator prints first with `flags` and `--port 0`; then it is killed."""
    proc = subprocess.Popen([sys.executable, "-m", "tensorflow_elastic.rendezvous", "--port", "0",
                             *flags], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        return [proc.stdout.readline() for _ in range(2)]
    finally:
        proc.kill()
        proc.wait(10)


def test_the_orchestrator_and_its_metrics_listen_on_loopback_by_default():
    lines = _first_two_lines("--metrics_port", "0")
    assert lines[0].startswith("metrics on http://127.0.0.1:"), lines
    assert lines[1].startswith("listening on 127.0.0.1:"), lines


def test_insecure_allows_every_interface_with_a_warning():
    lines = _first_two_lines("--host", "0.0.0.0", "--insecure")
    assert lines[0].startswith("warning: no token") and lines[1].startswith("listening on 0.0.0.0:")


def test_refusals_of_one_peer_are_logged_once_per_interval_with_their_count(caplog):
    now = [0.0]
    log = auth.RefusalLog(clock=lambda: now[0])
    with caplog.at_level("WARNING", logger=auth.__name__):
        for _ in range(5):
            log.refused("ipv4:10.0.0.5:4242", "/tensorflow_elastic.Rendezvous/Join")
        log.refused("ipv6:[::1]:4243", "/tensorflow_elastic.Rendezvous/Status")
        now[0] = auth.REFUSAL_LOG_INTERVAL_S
        log.refused("ipv4:10.0.0.5:4299", "/tensorflow_elastic.Rendezvous/Leave")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert "from 10.0.0.5: 1 since" in lines[0] and "from ::1: 1 since" in lines[1]
    assert "from 10.0.0.5: 5 since" in lines[2] and "Leave" in lines[2]
