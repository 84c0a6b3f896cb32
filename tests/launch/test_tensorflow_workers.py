"""The launcher with real TensorFlow workers: in-process elasticity (seed usage, graceful leave,
a killed worker coming back as a new node) and restart-based elasticity of a plain MWMS script."""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys

import pytest

from tensorflow_elastic.observability import events

pytestmark = pytest.mark.multiprocess

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CUSTOM_LOOP = os.path.join(REPO_ROOT, "examples", "custom_loop.py")
KERAS_FIT = os.path.join(REPO_ROOT, "examples", "keras_fit.py")


def log_dir(output: str) -> str:
    """The directory the launcher said holds its workers' full output."""
    return re.search(r"\[agent\] workers' full output: (\S+)", output).group(1)


def _steps(proc, node: int) -> list[dict]:
    """The JSON step lines the elastic test worker printed under ``[node N]``."""
    prefix = f"[node {node}] "
    return [json.loads(line[len(prefix):]) for line in list(proc.lines)
            if line.startswith(prefix + '{"node"')]


def test_seed_usage_two_launchers_then_a_preempted_one_leaves_gracefully(start, scripts, port,
                                                                          tmp_path):
    events_file = tmp_path / "events.jsonl"
    orchestrator = start("--standalone", f"--rdzv_endpoint=127.0.0.1:{port()}",
                         f"--events_file={events_file}", "start")
    endpoint = orchestrator.wait_for(r"listening on (\S+)")[0].group(1)
    # Launchers of different sizes: the job's worker bounds are given directly.
    common = [f"--rdzv_endpoint={endpoint}", "--nworkers=2:3", f"--events_file={events_file}"]
    a = start("--monitor_interval=1", f"--address=127.0.0.1:{port()}", "--nproc_per_node=2",
              *common, scripts.elastic, "80", "0.05")
    b = start("--monitor_interval=1", "--address=127.0.0.1", *common, scripts.elastic, "80", "0.05")
    b_node = int(b.wait_for(r'^\[node (\d+)\] \{"node"')[0].group(1))
    b.wait_for(r'"step": 10,')
    b.signal(signal.SIGTERM)  # a preemption notice for b's machine
    assert b.wait() == 0, b.output
    assert a.wait() == 0, a.output
    a_nodes = sorted({int(m.group(1)) for m in a.wait_for(r'^\[node (\d+)\] \{"done"', count=2)})
    for node in a_nodes:
        steps = _steps(a, node)
        assert steps[-1]["step"] == 80 and steps[-1]["world"] == 2
        assert [s["step"] for s in steps] == sorted({s["step"] for s in steps}), "work redone"
    left = [e for e in events.read_events(str(events_file), events.NODE_LEFT)
            if e.get("source") == "worker"]
    assert [e["node"] for e in left] == [b_node]
    assert list(events.read_events(str(events_file), events.STATE_RESTORED)) == []


def test_killed_elastic_worker_comes_back_as_a_new_node_and_the_plot_shows_it(start, tmp_path):
    events_file = tmp_path / "events.jsonl"
    proc = start("--standalone", "--nworkers=2:3", "--nproc_per_node=3", "--max_restarts=1",
                 "--monitor_interval=0.5", f"--events_file={events_file}", CUSTOM_LOOP,
                 "--steps=240", "--step_sleep=0.05")
    proc.wait_for(r"\] step 50 loss")
    first_nodes = {int(m.group(1)) for m in proc.wait_for(r"^\[node (\d+)\] step 50 ", count=3)}
    victim = proc.worker_pids()[2][0]
    os.kill(victim, signal.SIGKILL)
    assert proc.wait(240) == 0, proc.output
    assert len(proc.worker_pids()[2]) == 2  # restarted once
    done_nodes = {int(m.group(1)) for m in proc.wait_for(r"^\[node (\d+)\] done: 240 steps",
                                                         count=3)}
    assert len(done_nodes - first_nodes) == 1, "the restarted worker did not join as a new node"
    assert "killed by SIGKILL" in proc.output
    # One line from the new chief per change; TensorFlow's abort messages only in the log files.
    assert re.search(r"generation \d+: node\(s\) \[\d+\] lost \(\w+Error\); 2 member\(s\); "
                     r"recovered in [\d.]+ s, [01] step\(s\) lost", proc.output), proc.output
    assert re.search(r"generation \d+: node\(s\) \[\d+\] joined; 3 member\(s\); paused", proc.output)
    assert "StartAbort" not in proc.output and "Restart your program" not in proc.output
    logs = "".join(p.read_text() for p in pathlib.Path(log_dir(proc.output)).rglob("output.log"))
    assert "step 50 loss" in logs
    # A re-form updates the running server; it does not enable collective ops again.
    assert "Enabling collective ops after program startup" not in proc.output + logs
    starts = list(events.read_events(str(events_file), events.GENERATION_START))
    sizes = [e["world_size"] for e in starts if e.get("source") == "orchestrator"]
    shrunk = sizes.index(2)  # the survivors went on without the victim
    assert 3 in sizes[shrunk:]  # then the restarted worker joined them

    png = tmp_path / "timeline.png"
    plot = subprocess.run([sys.executable, "-m", "tensorflow_elastic.cli", "plot",
                           str(events_file), "-o", str(png)],
                          capture_output=True, text=True, timeout=120)
    assert plot.returncode == 0, plot.stderr
    assert png.stat().st_size > 10_000
    assert re.search(r"failure 1 at \+[\d.]+ s \(nodes \[\d+\]\): recovered in", plot.stdout), \
        plot.stdout


def test_keras_fit_example_trains_under_the_launcher_and_its_loss_falls(start, tmp_path):
    """The example's plain `model.fit` with the elastic callback, and its chief's CSV log."""
    events_file = tmp_path / "events.jsonl"
    csv_log = tmp_path / "log.csv"
    proc = start("--standalone", "--nworkers=2:3", "--nproc_per_node=3", "--monitor_interval=0.5",
                 f"--events_file={events_file}", KERAS_FIT, "--epochs=3", "--steps_per_epoch=20",
                 "--plain_fit", f"--csv_log={csv_log}")
    assert proc.wait(90) == 0, proc.output
    assert "in-process elasticity" in proc.output
    epochs = [m for m in map(re.compile(r"^\[node (\d+)\] epoch (\d) loss ([\d.]+) .* world (\d)$")
                             .match, proc.lines) if m]
    losses: dict[int, list[float]] = {}
    for m in epochs:
        assert m.group(4) == "3"
        losses.setdefault(int(m.group(1)), []).append(float(m.group(3)))
    assert len(losses) == 3, proc.output
    for node_losses in losses.values():
        assert len(node_losses) == 3 and node_losses == sorted(node_losses, reverse=True), losses
        assert node_losses[-1] < 0.8 * node_losses[0], losses
    assert len(proc.wait_for(r"^\[node \d+\] done: 3 epochs$", count=3)) == 3
    steps: dict[int, list[int]] = {}
    for e in events.read_events(str(events_file), events.STEP):
        steps.setdefault(e["node"], []).append(e["step"])
    assert sorted(steps) == sorted(losses)  # the runtime's step events, one per 10 commits
    assert all(s == sorted(set(s)) and s[-1] >= 50 for s in steps.values()), steps
    rows = csv_log.read_text().splitlines()
    assert rows[0].startswith("epoch,") and [r.split(",")[0] for r in rows[1:]] == ["0", "1", "2"]


def test_plain_mwms_script_survives_a_kill_and_resumes_from_its_backup(start, scripts, tmp_path):
    backup = tmp_path / "backup"
    events_file = tmp_path / "events.jsonl"
    proc = start("--standalone", "--nnodes=1", "--nproc_per_node=2", "--monitor_interval=0.5",
                 f"--events_file={events_file}", scripts.mwms, str(backup), "40", "0.1")
    assert "[agent] restart elasticity: the script does not call" in \
        proc.wait_for(r"\[agent\] restart elasticity")[0].string
    proc.wait_for(r'"step": 12,')
    os.kill(proc.worker_pids()[1][0], signal.SIGKILL)
    assert proc.wait(240) == 0, proc.output
    pids = proc.worker_pids()
    assert len(pids[0]) == 2 and len(pids[1]) == 2  # the whole group restarted once
    records = [json.loads(line.split("] ", 1)[1]) for line in proc.lines
               if re.match(r"^\[node \d\] \{", line)]
    resumed = {r["resumed_from"] for r in records if "resumed_from" in r}
    assert max(resumed) >= 10, "the restarted workers did not resume from the backup"
    assert [r["step"] for r in records if r.get("done")] == [40, 40]
    agent_starts = [e for e in events.read_events(str(events_file), events.GENERATION_START)
                    if e.get("source") == "agent"]
    assert len({e["generation"] for e in agent_starts}) == 2
    assert "1 worker failure(s) on this node were survived" in proc.output


def test_a_secured_job_passes_its_token_and_tls_trust_down_to_every_worker(start, tmp_path,
                                                                          tls_files):
    cert, key = tls_files
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    script = tmp_path / "joins.py"
    script.write_text("import tensorflow_elastic as tfe\n"
                      "runtime = tfe.init()\n"
                      "print(f'joined as node {runtime.node_id} of generation "
                      "{runtime.generation}', flush=True)\n")
    proc = start("--standalone", "--nnodes=1", "--nproc_per_node=2", "--tls_cert", cert,
                 "--tls_key", key, "--token_file", str(token), str(script))
    assert proc.wait(180) == 0, proc.output
    joined = proc.wait_for(r"joined as node (\d+) of generation 1", count=2)
    assert {int(m.group(1)) for m in joined} == {0, 1}



@pytest.mark.parametrize("bad, error", [
    ("truncated", r"DataLossError: .*part-001\.tfrecord: truncated file: .* at offset \d+"),
    ("no files", r"ValueError: the TFRecord input has no files")])
def test_a_bad_tfrecord_input_every_worker_hits_ends_the_job_at_once(start, tmp_path,
                                                                      monkeypatch, bad, error):
    """A plain `model.fit` over TFRecord files that cannot be read: a setup error every worker
    hits, the same way, so the job ends at once with it instead of restarting its workers."""
    from tests.data.tfrecord_files import write_files

    data = tmp_path / "data"
    data.mkdir()
    if bad == "truncated":
        files = write_files(str(data), [40, 40])
        with open(files[1], "r+b") as f:
            f.truncate(os.path.getsize(files[1]) - 3)
    for name, value in {"TF_USE_LEGACY_KERAS": "0", "KERAS_FIT_PLAIN": "1",
                        "KERAS_FIT_TFRECORD": "direct", "KERAS_FIT_TFRECORD_DIR": str(data),
                        "KERAS_FIT_OUT": str(tmp_path)}.items():
        monkeypatch.setenv(name, value)
    proc = start("--standalone", "--nproc-per-node", "2", "--max-restarts", "5",
                 os.path.join(REPO_ROOT, "tests", "training", "keras_fit_worker.py"),
                 "1", "80", "8", "0")
    assert proc.wait(120) == 1, proc.output
    assert {rank: len(pids) for rank, pids in proc.worker_pids().items()} == {0: 1, 1: 1}
    assert "every worker failed the same way before the first step: not restarted" in \
        proc.output, proc.output
    assert re.search(error, proc.output), proc.output
