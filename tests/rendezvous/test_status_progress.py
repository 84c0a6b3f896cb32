"""`tfelastic status --events_file`: the step and the recent step rate from step events."""

import subprocess
import sys

from tensorflow_elastic.cli import format_progress
from tensorflow_elastic.observability import events
from tensorflow_elastic.observability.progress import recent_step_rate


def _write_steps(path, pairs):
    """Step events at chosen times (the event log stamps the current time)."""
    lines = [f'{{"time": {t}, "event": "step", "node": 0, "generation": 1, "step": {s}}}'
             for t, s in pairs]
    path.write_text("\n".join(lines) + "\n")


def test_rate_over_the_recent_window(tmp_path):
    path = tmp_path / "events.jsonl"
    _write_steps(path, [(100.0, 0), (150.0, 100), (160.0, 120), (170.0, 140)])
    step, rate = recent_step_rate(str(path), window_s=30.0)
    assert step == 140
    assert rate == 2.0  # (140 - 100) steps over 20 s: the window starts at t = 140


def test_no_step_events(tmp_path):
    path = tmp_path / "events.jsonl"
    events.EventLog(str(path)).record(events.NODE_JOINED, node=1)
    assert recent_step_rate(str(path)) is None
    assert "no step events" in format_progress(str(path))


def test_unreadable_file_is_reported(tmp_path):
    assert "cannot read" in format_progress(str(tmp_path / "missing.jsonl"))


def test_status_prints_progress(orchestrator, nodes_for, tmp_path):
    nodes_for(orchestrator.endpoint).join(1, min_nodes=1, max_nodes=1)
    path = tmp_path / "events.jsonl"
    _write_steps(path, [(10.0, 5), (12.0, 9)])
    out = subprocess.run([sys.executable, "-m", "tensorflow_elastic.cli", "status",
                          "--rdzv_endpoint", orchestrator.endpoint, "--events_file", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "run job: ACTIVE" in out.stdout
    assert "progress: step 9, 2.00 steps/s" in out.stdout
