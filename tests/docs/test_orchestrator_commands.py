"""docs/orchestrator.md's secured job, run as written (tests/doc_commands.py registers it): a
token and a certificate made with openssl, an orchestrator that keeps its state and serves TLS,
one launcher per machine (two here, on one machine) and the live status."""

from __future__ import annotations

import signal

import pytest

from tests.doc_commands import JOB_S, registered

pytestmark = pytest.mark.multiprocess


def test_a_secured_orchestrator(shell, port, tmp_path):
    token, certificate, orchestrator, launcher, status = registered("test_a_secured_orchestrator")
    (tmp_path / "shared").mkdir()
    # orch.example is the orchestrator's host name: here the certificate names localhost.
    placeholders = {"/shared/tfelastic": str(tmp_path / "shared"), "orch.example": "localhost",
                    "/var/lib/tfelastic": str(tmp_path / "state"), "29400": str(port()),
                    "train.py": "examples/custom_loop.py"}
    for command in (token, certificate):
        made = shell(command, placeholders)
        assert made.wait() == 0, made.tail()
    server = shell(orchestrator, placeholders)
    server.wait_for(r"listening on")
    machines = [shell(launcher, placeholders) for _ in range(2)]
    watch = shell(status, placeholders)
    watch.wait_for(r"generation [1-9]", timeout=JOB_S)
    watch.signal(signal.SIGINT)
    assert watch.wait() == 0, watch.tail()
    for machine in machines:
        assert machine.wait(JOB_S) == 0, machine.tail()
    assert any((tmp_path / "state").iterdir()), "no state in --state_dir"
