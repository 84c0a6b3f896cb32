"""The worker pods' entrypoint (ConfigMap tfelastic-worker-entrypoint), run with /bin/sh.

It stands between the kubelet and tfelastic-run: SIGTERM must reach the
launcher and the pod must end with the launcher's code, while a job that
completed must not end the container (a StatefulSet would start it again).
A fake tfelastic-run first on PATH records its arguments and the signals it gets.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

WAIT_S = 10.0
FAKE_LAUNCHER = """\
import json, os, signal, sys, time
state = sys.argv[0] + ".state"
def record(**fields):
    with open(state, "a") as f:
        f.write(json.dumps(fields) + "\\n")
def on_term(signum, frame):
    record(signal="SIGTERM")
    sys.exit(int(os.environ["EXIT_ON_SIGTERM"]))
signal.signal(signal.SIGTERM, on_term)
record(args=sys.argv[1:])
if "EXIT_AT_ONCE" in os.environ:
    sys.exit(int(os.environ["EXIT_AT_ONCE"]))
time.sleep(60)
sys.exit(99)
"""


class Entrypoint:
    """run-worker.sh started as the kubelet would, with a fake tfelastic-run."""

    def __init__(self, tmp_path: Path, script: str, env: dict[str, str]):
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        fake = bin_dir / "tfelastic-run"
        fake.write_text(f"#!{sys.executable}\n{FAKE_LAUNCHER}")
        fake.chmod(0o755)
        self.state = Path(f"{fake}.state")
        entrypoint = tmp_path / "run-worker.sh"
        entrypoint.write_text(script)
        environ = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **env}
        self.proc = subprocess.Popen(["/bin/sh", str(entrypoint), "--nnodes=2:8", "train.py"],
                                     env=environ, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)

    def records(self) -> list[dict]:
        if not self.state.exists():
            return []
        return [json.loads(line) for line in self.state.read_text().splitlines()]

    def wait_for_launcher(self) -> None:
        deadline = time.monotonic() + WAIT_S
        while not self.records():
            assert time.monotonic() < deadline, "the fake tfelastic-run never started"
            time.sleep(0.05)

    def still_running_after(self, seconds: float) -> bool:
        try:
            self.proc.wait(seconds)
        except subprocess.TimeoutExpired:
            return True
        return False

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc.stderr.close()


@pytest.fixture
def entrypoint(tmp_path, resource):
    script = resource("ConfigMap", "tfelastic-worker-entrypoint")["data"]["run-worker.sh"]
    started: list[Entrypoint] = []

    def start(**env: str) -> Entrypoint:
        started.append(Entrypoint(tmp_path, script, env))
        return started[-1]

    yield start
    for e in started:
        e.kill()


def test_a_completed_job_keeps_the_container_up_until_sigterm(entrypoint):
    run = entrypoint(EXIT_AT_ONCE="0", EXIT_ON_SIGTERM="0")
    run.wait_for_launcher()
    assert run.still_running_after(1.0)
    run.proc.send_signal(signal.SIGTERM)
    assert run.proc.wait(WAIT_S) == 0
    assert "the job completed; idling" in run.proc.stderr.read()
    assert run.records() == [{"args": ["--nnodes=2:8", "train.py"]}]


def test_a_failed_launcher_ends_the_container_with_its_code(entrypoint):
    run = entrypoint(EXIT_AT_ONCE="3", EXIT_ON_SIGTERM="0")
    assert run.proc.wait(WAIT_S) == 3
    assert run.records() == [{"args": ["--nnodes=2:8", "train.py"]}]


@pytest.mark.parametrize("launcher_code", [0, 128 + signal.SIGTERM])
def test_sigterm_reaches_the_launcher_and_the_container_ends_with_its_code(entrypoint,
                                                                           launcher_code):
    run = entrypoint(EXIT_ON_SIGTERM=str(launcher_code))
    run.wait_for_launcher()
    run.proc.send_signal(signal.SIGTERM)
    assert run.proc.wait(WAIT_S) == launcher_code
    assert run.records()[-1] == {"signal": "SIGTERM"}
    assert "idling" not in run.proc.stderr.read()
