"""README.md's commands, run as written (tests/doc_commands.py registers them): the demo, one
machine's job with its live status and its plot, and a shared orchestrator with a token that
two launchers (two machines, here one) join."""

from __future__ import annotations

import re
import signal

import pytest

from tests.doc_commands import JOB_S, registered

pytestmark = pytest.mark.multiprocess

# The user's script in the README: the project's own custom loop takes its place.
SCRIPT = {"train.py": "examples/custom_loop.py"}


def test_the_demo(shell, tmp_path):
    [command] = registered("test_the_demo")
    demo = shell(command.removeprefix("./install.sh && "))
    assert demo.wait(JOB_S) == 0, demo.tail()
    assert "==> demo: killing worker pid" in demo.output and "==> summary" in demo.output
    assert (tmp_path / "timeline.png").stat().st_size > 0


def test_one_machine(shell, tmp_path):
    job_command, watch_command, plot_command = registered("test_one_machine")
    job = shell(job_command, SCRIPT)
    job.wait_for(r"\[agent\] worker 3 started")
    watch = shell(watch_command)
    watch.wait_for(r"\(every 2 s, Ctrl-C ends\)", timeout=JOB_S)
    watch.wait_for(r"world size [2-4]|step \d+", timeout=JOB_S)
    watch.signal(signal.SIGINT)
    assert watch.wait() == 0, watch.tail()
    assert job.wait(JOB_S) == 0, job.tail()
    plot = shell(plot_command)
    assert plot.wait() == 0, plot.tail()
    assert (tmp_path / "timeline.png").stat().st_size > 0


def test_a_shared_orchestrator(shell, two_machines, port, tmp_path):
    token, orchestrator, launcher, status = registered("test_a_shared_orchestrator")
    assert shell(token).wait() == 0
    assert re.fullmatch(r"[0-9a-f]{64}\n", (tmp_path / "token").read_text())
    placeholders = {"29400": str(port()), "HOST": "127.0.0.1", **SCRIPT}
    server = shell(orchestrator, placeholders)
    server.wait_for(r"listening on")
    two_machines(launcher, status, placeholders)
