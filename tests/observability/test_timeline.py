"""Summaries, status views and progress lines against the events file of a known run.

`data/demo_run.jsonl` is the record of a real `examples/demo.py` run (trimmed to one
worker's step events): 3 nodes start, node 0 is SIGKILLed after step 100, the
launcher brings it back as node 3, which joins; 900 steps; every worker leaves
after the exit barrier. Every figure below is what happened in that run.
"""

import json
import os
import subprocess
import sys

import pytest

from tensorflow_elastic.cli import format_job
from tensorflow_elastic.observability import timeline
from tensorflow_elastic.observability.progress import ProgressTracker

DEMO_RUN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "demo_run.jsonl")


@pytest.fixture
def demo():
    return timeline.load(DEMO_RUN)


def test_the_world_size_ends_with_the_job_not_with_the_members_leaving(demo):
    assert [w for _, w in demo.world] == [3, 2, 3]
    assert (demo.generation, demo.members) == (3, [1, 2, 3])


def test_each_node_joins_once_however_often_it_is_recorded(demo):
    # Node 3 registered (standby) and then joined: two node_joined events, one join.
    assert [node for _, node in demo.joins] == [0, 1, 2, 3]


def test_the_last_step_is_the_one_the_job_completed_at(demo):
    # Step events come every 10 commits; the job completed at 900.
    assert max(s for _, s in demo.steps) < 900 and demo.final_step == 900


def test_the_summary_tells_what_happened(demo):
    text = timeline.summary(demo)
    first, failure = text.splitlines()
    assert "job completed" in first and "last step 900" in first
    assert "world size 3 -> 2 -> 3;" in first
    assert "4 node(s) joined (3 at the start, 1 later), 1 failure(s)" in first
    assert "(nodes [0])" in failure and "lost steps 1" in failure


def test_without_a_final_step_the_last_step_event_counts(tmp_path):
    path = tmp_path / "events.jsonl"
    with open(DEMO_RUN) as src, open(path, "w") as dst:
        for line in src:
            entry = json.loads(line)
            entry.pop("step", None) if entry["event"] == "job_complete" else None
            dst.write(json.dumps(entry) + "\n")
    run = timeline.load(str(path))
    assert run.final_step == max(s for _, s in run.steps)


def test_the_progress_line_reports_the_job_s_world_size(tmp_path):
    path = tmp_path / "events.jsonl"
    with open(DEMO_RUN) as src:
        path.write_text("".join(line for line in src if '"event": "step"' in line))
    line = ProgressTracker(str(path)).line()
    assert line.startswith("progress: step ") and line.endswith("world size 3")


def test_the_status_view_of_an_events_file(demo):
    text = format_job(DEMO_RUN)
    assert "completed, generation 3, world size 3, members [1, 2, 3]" in text
    assert "nodes [0]" in text and "recovered in <=" in text


def test_status_watch_refreshes_the_view_from_an_events_file():
    out = subprocess.run([sys.executable, "-m", "tensorflow_elastic.cli", "status",
                          "--events_file", DEMO_RUN, "--watch", "0.1", "--count", "2"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("(every 0.1 s, Ctrl-C ends)") == 2
    assert out.stdout.count("members [1, 2, 3]") == 2 and "progress: step 900" in out.stdout


def test_status_needs_an_orchestrator_or_an_events_file():
    out = subprocess.run([sys.executable, "-m", "tensorflow_elastic.cli", "status"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--rdzv_endpoint" in out.stderr
