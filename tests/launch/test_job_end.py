"""A finished job stays finished: a worker whose exit hangs after its training, and a node that
comes after the end, neither fail the job nor train it again."""

from __future__ import annotations

import os

import pytest

from tensorflow_elastic.launch import embedded
from tensorflow_elastic.rendezvous import Client, Phase

pytestmark = pytest.mark.multiprocess

HERE = os.path.dirname(os.path.abspath(__file__))
FINISHING_WORKER = os.path.join(HERE, "finishing_worker.py")


@pytest.mark.parametrize("hang", ["thread", "atexit", "code"])
def test_a_worker_whose_exit_hangs_after_its_training_finishes_the_job_once(
        start, tmp_path, monkeypatch, hang):
    monkeypatch.setenv("TFE_EXIT_TIMEOUT", "2")
    starts = tmp_path / "starts"
    proc = start("--standalone", "--nproc_per_node", "1", "--nworkers", "1:1",
                 "--max_restarts", "2", "--monitor_interval", "0.2", FINISHING_WORKER,
                 str(starts), hang)
    assert proc.wait(90) == 0, proc.output
    assert len(starts.read_text().splitlines()) == 1, proc.output
    assert len(proc.worker_pids()[0]) == 1, proc.output


def test_a_node_that_comes_after_the_end_is_told_the_job_is_complete(start, tmp_path):
    # The orchestrator as `tfelastic-run --standalone SCRIPT` embeds it: it serves that one job.
    server = embedded.serve("127.0.0.1:0", None, None, None, False, None)
    try:
        starts = tmp_path / "starts"
        common = ["--rdzv_endpoint", server.endpoint, "--nnodes", "1:2", "--nproc_per_node", "1",
                  "--monitor_interval", "0.2", FINISHING_WORKER, str(starts), "none"]
        first = start(*common)
        assert first.wait(90) == 0, first.output
        late = start(*common)
        assert late.wait(90) == 0, late.output
        assert "the job is complete" in late.output, late.output
        assert len(starts.read_text().splitlines()) == 1, late.output
        with Client(server.endpoint, "default", retry_timeout=5) as client:
            [run] = client.status()
        assert run.reason.startswith("completed: every node left"), run.reason
        assert "run_restarted" not in [h["event"] for h in run.history]
    finally:
        server.stop()
