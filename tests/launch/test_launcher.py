"""The launcher with real processes that need no TensorFlow: bad arguments, crashes and the
restart limit, signal forwarding, held ports handed to workers, the exit barrier, the
orchestrator-only seed usage."""

import json
import signal

import pytest

from tensorflow_elastic.observability import events
from tensorflow_elastic.rendezvous import Client

pytestmark = [pytest.mark.multiprocess, pytest.mark.light]


@pytest.mark.parametrize("args, reason", [
    (["--nnodes", "3:2", "SCRIPT"], "need 1 <= MIN <= MAX"),
    (["--nnodes", "two", "SCRIPT"], "--nnodes must be N or MIN:MAX"),
    (["--nworkers", "2", "--nproc_per_node", "3", "SCRIPT"], "more than the --nworkers maximum"),
    (["--nworkers", "1:x", "SCRIPT"], "--nworkers must be N or MIN:MAX"),
    (["--max_restarts", "-1", "SCRIPT"], "--max_restarts must be >= 0"),
    (["--rdzv_endpoint", "nowhere", "SCRIPT"], "expected HOST:PORT"),
    (["missing_script.py"], "script 'missing_script.py' not found"),
    (["start"], "'start' runs only an orchestrator and needs --standalone"),
    (["--standalone", "--rdzv_endpoint", "0.0.0.0:0", "SCRIPT"], "without a token"),
    (["--role", "ps", "--ps_address", "0.0.0.0:7070", "SCRIPT"], "without a token"),
    (["--tls_cert", "cert.pem", "SCRIPT"], "--tls_cert and --tls_key go together"),
])
def test_bad_arguments_end_with_one_line_and_code_2(start, scripts, args, reason):
    proc = start(*[scripts.plain if a == "SCRIPT" else a for a in args])
    assert proc.wait(30) == 2
    assert len(proc.lines) == 1 and reason in proc.lines[0], proc.output


def test_unreachable_endpoint_fails_with_a_reason_instead_of_hanging(start, scripts, port):
    proc = start("--rdzv_endpoint", f"127.0.0.1:{port()}", "--rdzv_timeout", "2", scripts.plain)
    assert proc.wait(60) == 1
    assert proc.lines[-1].startswith("tfelastic-run: error: cannot reach the orchestrator at")


def test_crashing_worker_is_restarted_up_to_the_limit_then_fails_with_root_cause(start, scripts, tmp_path):
    events_file = tmp_path / "events.jsonl"
    proc = start("--standalone", "--max_restarts", "2", "--monitor_interval", "0.2",
                 "--elastic_mode", "restart", "--events_file", str(events_file),
                 "--log_dir", str(tmp_path / "logs"), scripts.plain, "--crash")
    assert proc.wait() == 1, proc.output
    assert len(proc.worker_pids()[0]) == 3  # the first start and two restarts
    out = proc.output
    assert "Root cause (first failure):" in out
    assert "exit code 1: ZeroDivisionError: the worker divided by zero on purpose" in out
    assert "raise ZeroDivisionError" in out  # the traceback tail from the error file
    assert "(--max_restarts=2)" in out
    # Every output line of the worker carries its node id.
    assert any(line.startswith("[node 0] ") and '"world": 1' in line for line in proc.lines)
    failures = list(events.read_events(str(events_file), events.FAILURE_DETECTED))
    assert [e["source"] for e in failures if e.get("source") == "agent"] == ["agent"] * 3


@pytest.mark.parametrize("mode", ["restart", "in_process"])
def test_a_setup_error_every_worker_hits_ends_the_job_at_once_without_restarts(start, scripts,
                                                                              mode):
    proc = start("--standalone", "--nproc-per-node", "2", "--max-restarts", "5",
                 "--elastic-mode", mode, scripts.plain, "--setup_error")
    assert proc.wait(60) == 1, proc.output
    assert proc.times[-1] - proc.times[0] < 10, proc.output
    assert {rank: len(pids) for rank, pids in proc.worker_pids().items()} == {0: 1, 1: 1}
    out = proc.output
    assert "every worker failed the same way before the first step: not restarted" in out
    assert "ValueError: learning_rate must be positive, got -1" in out
    assert "restart 1 of" not in out


def test_sigterm_is_forwarded_and_the_launcher_leaves_gracefully(start, scripts, tmp_path):
    events_file = tmp_path / "events.jsonl"
    proc = start("--standalone", "--nproc_per_node", "2", "--nworkers", "1:2",
                 "--elastic_mode", "restart", "--monitor_interval", "0.2",
                 "--events_file", str(events_file), scripts.plain, "--max_seconds", "100")
    proc.wait_for(r'"world": 2', count=2)
    proc.signal(signal.SIGTERM)
    assert proc.wait() == 0, proc.output
    assert len(proc.wait_for(r"^\[node \d\] got SIGTERM$")) == 2
    assert "STOPPED" in proc.output
    left = [e for e in events.read_events(str(events_file), events.NODE_LEFT)
            if e.get("source") == "agent"]
    assert sorted(e["node"] for e in left) == [0, 1]


def test_in_process_workers_inherit_their_port_held(start, scripts):
    proc = start("--standalone", "--nproc_per_node", "2", "--nnodes", "1",
                 "--elastic_mode", "in_process", scripts.plain, "--seconds", "0.1")
    assert proc.wait() == 0, proc.output
    lines = [json.loads(m.group(1)) for m in proc.wait_for(r"^\[worker \d\] (\{.*\})$", count=2)]
    assert all(line["held_port"] == int(line["address"].rsplit(":", 1)[1]) for line in lines)
    assert lines[0]["address"] != lines[1]["address"]


@pytest.mark.serial  # an orchestrator child binds a port chosen before it starts
def test_exit_barrier_keeps_a_finished_node_until_every_node_is_done(start, scripts, port, tmp_path):
    orchestrator = start("--standalone", "--rdzv_endpoint", f"127.0.0.1:{port()}", "start")
    endpoint = orchestrator.wait_for(r"listening on (\S+)")[0].group(1)
    slow_done = tmp_path / "slow.done"
    common = ["--rdzv_endpoint", endpoint, "--nnodes", "2", "--elastic_mode", "restart",
              "--monitor_interval", "0.2"]
    fast = start(*common, scripts.plain, "--seconds", "0.5")
    slow = start(*common, scripts.plain, "--stop_file", str(tmp_path / "stop"),
                 "--done_file", str(slow_done))
    fast.wait_for(r"\[agent\] worker 0 \(node \d+\) finished")
    slow.wait_for(r'"world": 2')
    assert fast.proc.poll() is None, "the fast node left before the slow one finished"
    (tmp_path / "stop").write_text("")
    assert slow.wait() == 0, slow.output
    assert fast.wait() == 0, fast.output
    assert slow_done.exists()


@pytest.mark.serial  # an orchestrator child binds a port chosen before it starts
def test_seed_usage_orchestrator_only_serves_until_sigterm(start, port):
    port = port()
    proc = start("--standalone", f"--rdzv_endpoint=127.0.0.1:{port}", "start")
    assert proc.wait_for(r"listening on (\S+)")[0].group(1) == f"127.0.0.1:{port}"
    with Client(f"127.0.0.1:{port}", "probe", retry_timeout=10) as client:
        assert client.status(all_runs=True) == []
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0


def test_help_explains_both_kinds_of_scripts(start):
    proc = start("--help")
    assert proc.wait(30) == 0
    for flag in ("--standalone", "--rdzv_endpoint", "--nnodes", "--nproc_per_node",
                 "--monitor_interval", "--address", "--max_restarts", "--run_id", "--events_file"):
        assert flag in proc.output
    assert "MultiWorkerMirroredStrategy" in proc.output and "TF_CONFIG" in proc.output


def test_nnodes_counts_nodes_each_with_nproc_per_node_workers_as_in_torchrun(start, scripts):
    proc = start("--standalone", "--nnodes", "1:2", "--nproc_per_node", "2", scripts.plain)
    proc.wait_for(r"\(run default, workers 2:4\)")
    proc.wait_for(r"\[agent\] worker \d started", count=2)
    assert len(proc.worker_pids()) == 2
