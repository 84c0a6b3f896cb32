"""The parameter-server mode under the launcher, with real processes on 127.0.0.1:
a worker killed, another joining, the PS killed with SIGKILL and resumed from its checkpoint."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from tensorflow_elastic.observability import events

pytestmark = pytest.mark.multiprocess

HERE = os.path.dirname(os.path.abspath(__file__))
PS_TRAIN = os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples", "ps_train.py")


@pytest.mark.parametrize("args, reason", [
    (["--role", "ps", "SCRIPT"], "--role ps needs --ps_address"),
    (["--role", "worker", "--ps_address", "nowhere", "SCRIPT"], "--ps_address: expected HOST:PORT"),
    (["--role", "ps", "--ps_address", "127.0.0.1:1", "--nproc_per_node", "2", "SCRIPT"],
     "runs one parameter server process"),
    (["--ps_address", "127.0.0.1:1", "SCRIPT"], "belongs to the parameter-server mode"),
    (["--role", "worker", "--ps_address", "127.0.0.1:1", "--ps_checkpoint_dir", "x", "SCRIPT"],
     "is for --role ps"),
])
def test_bad_role_arguments_end_with_one_line_and_code_2(start, args, reason):
    proc = start(*[PS_TRAIN if a == "SCRIPT" else a for a in args])
    assert proc.wait(30) == 2
    assert len(proc.lines) == 1 and reason in proc.lines[0], proc.output


def test_help_explains_the_parameter_server_roles(start):
    proc = start("--help")
    assert proc.wait(30) == 0
    assert "--role ps" in proc.output and "--ps_address" in proc.output
    assert "parameter-server mode" in proc.output


def _events(path: str, name: str) -> list[dict]:
    return list(events.read_events(path, name)) if os.path.exists(path) else []


def _wait_for_event(path: str, name: str, condition=lambda e: True, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [e for e in _events(path, name) if condition(e)]
        if found:
            return found[-1]
        time.sleep(0.2)
    raise AssertionError(f"no {name} event in {timeout} s")


def test_workers_come_and_go_and_the_ps_survives_sigkill(start, port, tmp_path):
    events_file = str(tmp_path / "events.jsonl")
    address = f"127.0.0.1:{port()}"
    train = [PS_TRAIN, "--policy", "asypq", "--iterations", "300", "--workers", "3",
             "--step_sleep", "0.05", "--checkpoint_every", "20", "--lease_timeout", "2"]
    common = ["--ps_address", address, "--events_file", events_file, "--monitor_interval", "0.2"]
    ps = start("--role", "ps", "--ps_checkpoint_dir", str(tmp_path / "ckpt"),
               "--max_restarts", "2", *common, *train)
    ps.wait_for(r"listening on")
    trio = start("--role", "worker", "--nproc_per_node", "3", "--max_restarts", "0", *common,
                 *train)
    _wait_for_event(events_file, events.STEP, lambda e: e["step"] >= 20)

    victim = trio.worker_pids()[1][0]
    os.kill(victim, signal.SIGKILL)
    lost = _wait_for_event(events_file, events.FAILURE_DETECTED,
                           lambda e: e.get("cause") == "lease expired")
    newcomer = start("--role", "worker", *common, *train)
    joined = _wait_for_event(events_file, events.NODE_JOINED,
                             lambda e: e["node"] not in (0, 1, 2))
    assert joined["time"] > lost["time"]

    checkpoint = _wait_for_event(events_file, "checkpoint_saved")
    ps_pid = ps.worker_pids()[0][0]
    os.kill(ps_pid, signal.SIGKILL)
    ps.wait_for(r"restart 1 of 2")
    restored = _wait_for_event(events_file, events.STATE_RESTORED)
    assert restored["step"] >= checkpoint["version"] > 0

    assert ps.wait(180) == 0, ps.tail()
    assert newcomer.wait(60) == 0, newcomer.tail()
    assert trio.wait(60) == 0, trio.tail()
    complete = [e for e in _events(events_file, events.JOB_COMPLETE) if e.get("source") == "ps"]
    assert complete and complete[-1]["version"] > restored["step"]
    losses = [e["loss"] for e in _events(events_file, events.STEP) if e.get("loss") is not None]
    # Each loss is one worker's batch of 32 (a newcomer's first ones are on stale weights):
    # the median of the last ten says where training ended.
    assert len(losses) >= 10 and float(np.median(losses[-10:])) < losses[0] / 2, losses
