"""What the launcher prints in the parameter-server mode: the PS's lines carry its role, the
progress lines count parameter versions and PS workers, a restart brings back the PS (a process
that registers with no orchestrator is no new node)."""

from __future__ import annotations

import os

import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.light]

PS_ROLE_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ps_role_worker.py")


def test_the_ps_output_and_progress_speak_of_the_ps_and_its_workers(start, port, tmp_path):
    ps = start("--role", "ps", "--ps_address", f"127.0.0.1:{port()}", "--progress_interval",
               "0.2", "--events_file", str(tmp_path / "events.jsonl"), "--max_restarts", "1",
               PS_ROLE_WORKER, "3")
    assert ps.wait() == 3, ps.tail()
    assert [line for line in ps.lines if "listening on" in line][0].startswith("[ps] listening on")
    assert "[agent] restart 1 of 1: worker 0 (parameter server) comes back" in ps.lines
    progress = [line for line in ps.lines if "progress:" in line]
    assert progress and all(line.startswith("[agent] progress: parameter version ")
                            and " 3 PS worker(s)" in line for line in progress), ps.output
    for wrong in ("world size", "[worker 0]", "new node", "had not joined"):
        assert wrong not in ps.output, ps.output
