"""`tensorflowrun` with a discovery script whose hosts change, and a cooldown for failing hosts."""

import signal

import pytest

from tensorflow_elastic.launch import hosts

pytestmark = [pytest.mark.multiprocess, pytest.mark.light]

RUNNER = "tensorflow_elastic.launch.tensorflowrun"


def _discovery(tmp_path, lines: str):
    hostlist = tmp_path / "hosts.txt"
    hostlist.write_text(lines)
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hostlist}\n")
    script.chmod(0o755)
    return script, hostlist


def test_hosts_that_appear_and_vanish_grow_and_shrink_the_job(start, scripts, tmp_path):
    script, hostlist = _discovery(tmp_path, "127.0.0.1:1\n")
    stop = tmp_path / "stop"
    run = start("--min_nodes", "1", "--max_nodes", "2", "--discovery", str(script),
                "--discovery_interval", "0.3", "--elastic_mode", "restart",
                "--monitor_interval", "0.2", "python", scripts.plain, "--stop_file", str(stop),
                module=RUNNER)
    run.wait_for(r'^\[127\.0\.0\.1\] \[node \d+\] \{"world": 1')
    hostlist.write_text("127.0.0.1:1\nlocalhost:1\n")
    run.wait_for(r"starting an agent on localhost with 1 worker")
    run.wait_for(r'\] \{"world": 2', count=2)  # one worker on each host, TF_CONFIG of 2
    hostlist.write_text("127.0.0.1:1\n")
    run.wait_for(r"localhost is gone from discovery: stopping its agent")
    run.wait_for(r'^\[127\.0\.0\.1\] \[node \d+\] \{"world": 1', count=2)  # shrunk, restarted
    stop.write_text("")
    assert run.wait() == 0, run.output
    assert "an agent reports the job complete" in run.output


def test_a_failing_host_cools_down_longer_each_time(start, scripts, tmp_path):
    script, _ = _discovery(tmp_path, "127.0.0.1:1\n")
    run = start("--min_nodes", "1", "--max_nodes", "1", "--discovery", str(script),
                "--discovery_interval", "0.2", "--cooldown", "0.5", "--max_restarts", "0",
                "--elastic_mode", "restart", scripts.plain, "--crash", module=RUNNER)
    run.wait_for(r"127\.0\.0\.1 cools down for 0\.5 s")
    run.wait_for(r"127\.0\.0\.1 cools down for 1 s")
    assert len(run.wait_for(r"starting an agent on 127\.0\.0\.1", count=2)) >= 2
    run.signal(signal.SIGTERM)
    assert run.wait(60) == 128 + signal.SIGTERM


@pytest.mark.parametrize("args, reason", [
    (["--min_nodes", "1", "--max_nodes", "2", "SCRIPT"], "give --discovery SCRIPT or --hostfile"),
    (["--min_nodes", "3", "--max_nodes", "2", "--hostfile", "HOSTS", "SCRIPT"],
     "need 1 <= --min_nodes <= --max_nodes"),
    (["--min_nodes", "1", "--max_nodes", "2", "--hostfile", "HOSTS", "python"],
     "give the training script"),
    (["--min_nodes", "1", "--max_nodes", "2", "--discovery", "/nonexistent", "SCRIPT"],
     "missing or not executable"),
])
def test_bad_arguments(start, scripts, tmp_path, args, reason):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("127.0.0.1 slots=2\n")
    proc = start(*[{"SCRIPT": scripts.plain, "HOSTS": str(hostfile)}.get(a, a) for a in args],
                 module=RUNNER)
    assert proc.wait(30) == 2
    assert reason in proc.output


def test_host_lines_and_their_errors():
    assert hosts.parse_hosts("a:2\n# comment\nb slots=3\n\nc\n[::1]:4\n", "test") == \
        {"a": 2, "b": 3, "c": 1, "::1": 4}
    with pytest.raises(ValueError, match="test, line 2: expected 'host:slots'"):
        hosts.parse_hosts("a:2\nb:x:y\n", "test")
    with pytest.raises(ValueError, match="slots must be >= 1"):
        hosts.parse_hosts("a:0\n", "test")
    assert hosts.is_local("127.0.0.1") and hosts.is_local("localhost")
