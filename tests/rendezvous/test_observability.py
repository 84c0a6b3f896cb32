"""Watch streams, the health service, Prometheus metrics and the help texts."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

pytestmark = [pytest.mark.multiprocess, pytest.mark.light]


def test_watch_pushes_every_change(orchestrator, nodes_for):
    nodes = nodes_for(orchestrator.endpoint)
    (a, m), (b, _), (c, _) = nodes.join(3, 2, 3)
    updates: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [updates.put(u) for u in a.watch()], daemon=True).start()
    first = updates.get(timeout=20)
    assert (first.membership.generation, first.state) == (1, "ACTIVE")
    assert first.membership.members == m.members
    c.leave("preempted")
    pushed = updates.get(timeout=20)
    assert pushed.membership.generation == 2
    assert sorted(pushed.membership.members) == sorted([a.node_id, b.node_id])
    assert "preempted" in pushed.reason


def test_health_service_answers_without_token(start_orchestrator, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("t0ken")
    server = start_orchestrator("--token_file", str(token_file))
    with grpc.insecure_channel(server.endpoint) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "tensorflow_elastic.Rendezvous"):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as e:
            stub.Check(health_pb2.HealthCheckRequest(service="unknown"), timeout=10)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_metrics_endpoint(start_orchestrator, nodes_for):
    server = start_orchestrator("--metrics_port", "0")
    [metrics_url] = [line.split("metrics on ", 1)[1].strip() for line in server.output
                     if line.startswith("metrics on ")]
    (a, _), _ = nodes_for(server.endpoint).join(2, 2, 2)
    a.heartbeat()
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    assert 'tfelastic_members{run_id="job"} 2.0' in text
    assert 'tfelastic_generation{run_id="job"} 1.0' in text
    assert 'tfelastic_rendezvous_duration_seconds_count{run_id="job"} 1.0' in text
    assert 'tfelastic_rpcs_total{code="OK",method="Join"} 2.0' in text
    assert 'tfelastic_rpcs_total{code="OK",method="Heartbeat"}' in text


@pytest.mark.parametrize("module", ["tensorflow_elastic.rendezvous", "tensorflow_elastic.cli"])
def test_help(module, subprocess_env):
    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                         text=True, timeout=60, env=subprocess_env)
    assert out.returncode == 0
    assert ("--heartbeat_timeout" in out.stdout) or ("status" in out.stdout)

