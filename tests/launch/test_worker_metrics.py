"""The agent's metrics of its workers: from their node files to Prometheus, and served by
tfelastic-run --metrics_port (with the embedded orchestrator's under --standalone)."""

from __future__ import annotations

import io
import os
import signal
import threading
import time
import urllib.request

import prometheus_client as prom
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tensorflow_elastic.launch import LocalAgent, WorkerSpec, embedded, launcher, tensorflowrun
from tensorflow_elastic.launch.mode import View
from tensorflow_elastic.launch.worker_metrics import RATE_WINDOW_S, WorkerMetrics
from tensorflow_elastic.membership import node_file
from tensorflow_elastic.membership.node_file import NodeRecord, Progress
from tensorflow_elastic.observability.prometheus import Endpoint
from tensorflow_elastic.observability.progress import ProgressTracker
from tensorflow_elastic.rendezvous.types import NodeBounds

from .test_tensorflow_workers import CUSTOM_LOOP


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value of a /metrics page."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(registry: prom.CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_a_workers_progress_goes_through_its_node_file(tmp_path):
    progress = Progress(step=7)
    progress.recovered(0.5, 2)
    progress.sync_bytes += 4096
    path = str(tmp_path / "slot0")
    node_file.write(path, progress.record(3, 2, 4))
    assert node_file.read(path) == NodeRecord(3, 2, 4, 7, 1, (0.5,), 2, 4096)
    for _ in range(node_file.RECENT_RECOVERIES + 5):
        progress.recovered(1.0, 0)
    assert len(progress.record(3, 2, 4).recovery_seconds) == node_file.RECENT_RECOVERIES


@pytest.mark.parametrize("text", [
    '{"node_id": 1, "generation": 1, "world_size": 2, "step": -1}',
    '{"node_id": 1, "generation": 1, "world_size": 2, "recovery_seconds": ["x"]}',
    '{"node_id": 1, "generation": 1, "world_size": 2, "recovery_seconds": 3}',
    '{"node_id": 1, "generation": 1, "world_size": 2, "sync_bytes": 1.5}',
    '[1, 2, 3]'])
def test_a_node_file_that_is_not_a_record_is_ignored(tmp_path, text):
    path = tmp_path / "slot0"
    path.write_text(text)
    assert node_file.read(str(path)) is None


def test_an_older_node_file_without_progress_still_reads(tmp_path):
    path = tmp_path / "slot0"
    path.write_text('{"node_id": 4, "generation": 2, "world_size": 3}')
    assert node_file.read(str(path)) == NodeRecord(4, 2, 3)


def test_the_agent_counts_each_workers_figures_once_and_a_new_worker_from_zero():
    now = [100.0]
    metrics = WorkerMetrics("job", clock=lambda: now[0])
    registry = metrics.registry
    metrics.update([NodeRecord(1, 1, 2, step=10), None])
    metrics.update([NodeRecord(1, 2, 2, step=20, recoveries=1, recovery_seconds=(0.4,),
                               lost_steps=1, sync_bytes=100),
                    NodeRecord(2, 2, 2, step=20, recoveries=1, recovery_seconds=(0.6,),
                               lost_steps=1)])
    # The same records again count nothing twice.
    metrics.update([NodeRecord(1, 2, 2, step=20, recoveries=1, recovery_seconds=(0.4,),
                               lost_steps=1, sync_bytes=100), None])
    assert value(registry, "tfelastic_worker_recoveries_total", run_id="job", local_rank="0") == 1
    assert value(registry, "tfelastic_worker_recoveries_total", run_id="job", local_rank="1") == 1
    assert value(registry, "tfelastic_worker_recovery_duration_seconds_sum", run_id="job",
                 local_rank="0") == pytest.approx(0.4)
    assert value(registry, "tfelastic_worker_lost_steps_total", run_id="job", local_rank="0") == 1
    assert value(registry, "tfelastic_worker_sync_bytes_total", run_id="job", local_rank="0") == 100
    assert value(registry, "tfelastic_worker_generation", run_id="job") == 2
    assert value(registry, "tfelastic_worker_world_size", run_id="job") == 2
    # Slot 0's worker died; its replacement (node 5) reports from zero: all of it is new.
    metrics.update([NodeRecord(5, 3, 2, step=25, recoveries=1, recovery_seconds=(2.0,),
                               sync_bytes=50), None])
    assert value(registry, "tfelastic_worker_recoveries_total", run_id="job", local_rank="0") == 2
    assert value(registry, "tfelastic_worker_recovery_duration_seconds_count", run_id="job",
                 local_rank="0") == 2
    assert value(registry, "tfelastic_worker_sync_bytes_total", run_id="job", local_rank="0") == 150
    assert value(registry, "tfelastic_worker_step", run_id="job") == 25


def test_steps_per_second_are_measured_over_a_window():
    now = [0.0]
    metrics = WorkerMetrics("job", clock=lambda: now[0])
    metrics.update([NodeRecord(1, 1, 1, step=0)])
    now[0] = RATE_WINDOW_S / 2
    metrics.update([NodeRecord(1, 1, 1, step=50)])
    assert value(metrics.registry, "tfelastic_worker_steps_per_second", run_id="job") is None
    now[0] = RATE_WINDOW_S * 2
    metrics.update([NodeRecord(1, 1, 1, step=200)])
    assert value(metrics.registry, "tfelastic_worker_steps_per_second",
                 run_id="job") == pytest.approx(200 / (RATE_WINDOW_S * 2))


def test_a_progress_line_needs_no_events_file():
    tracker = ProgressTracker()
    assert tracker.line() == ""
    tracker.note(40, 3)
    tracker.note(30, 2)  # an older step changes nothing
    assert tracker.line() == "progress: step 40, world size 3"
    assert tracker.step == 40


def test_one_endpoint_serves_several_registries():
    first, second = prom.CollectorRegistry(), prom.CollectorRegistry()
    prom.Gauge("tfelastic_a", "a", registry=first).set(1)
    prom.Gauge("tfelastic_b", "b", registry=second).set(2)
    endpoint = Endpoint(first, second)
    port = endpoint.serve("127.0.0.1", 0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
            served = samples(page.read().decode())
    finally:
        endpoint.close()
    assert served[("tfelastic_a", ())] == 1 and served[("tfelastic_b", ())] == 2


@pytest.mark.multiprocess
def test_the_launcher_serves_its_workers_recovery_and_prints_progress_without_events(start):
    proc = start("--standalone", "--nworkers=2:3", "--nproc_per_node=3", "--max_restarts=1",
                 "--monitor_interval=0.5", "--progress_interval=1", "--metrics_port=0",
                 CUSTOM_LOOP, "--steps=240", "--step_sleep=0.05")
    url = proc.wait_for(r"\[agent\] metrics on (http://127\.0\.0\.1:\d+/metrics)")[0].group(1)
    proc.wait_for(r"^\[node \d+\] step 50 ", count=3)
    os.kill(proc.worker_pids()[2][0], signal.SIGKILL)
    deadline, served = time.monotonic() + 120, {}
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url, timeout=10) as page:
            served = samples(page.read().decode())
        if any(name == "tfelastic_worker_recoveries_total" and value_ >= 1
               for (name, _), value_ in served.items()):
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"no recovery in the metrics:\n{served}\n{proc.tail()}")
    job = (("run_id", "default"),)
    assert served[("tfelastic_worker_step", job)] >= 50
    assert served[("tfelastic_worker_world_size", job)] in (2, 3)
    assert served[("tfelastic_members", job)] in (2, 3)  # the embedded orchestrator's
    durations = [v for (name, _), v in served.items()
                 if name == "tfelastic_worker_recovery_duration_seconds_count"]
    assert sum(durations) >= 1
    assert proc.wait(240) == 0, proc.output
    assert "[agent] progress: step" in proc.output


def test_an_embedded_orchestrator_serves_its_metrics_when_asked(capsys):
    """tensorflowrun --metrics_port: its embedded orchestrator's metrics."""
    server = embedded.serve("127.0.0.1:0", None, None, None, False, None, metrics_port=0)
    try:
        url = capsys.readouterr().out.split("metrics on ", 1)[1].split()[0]
        with urllib.request.urlopen(url, timeout=10) as page:
            assert "tfelastic_rpcs" in page.read().decode()
    finally:
        server.stop()
    args = tensorflowrun.build_parser().parse_args(
        ["--metrics-port", "9100", "--min_nodes", "1", "--max_nodes", "2", "--hostfile", "hosts",
         "python", "train.py"])
    assert (args.metrics_port, args.metrics_host) == (9100, "127.0.0.1")


def test_the_launcher_refuses_metrics_for_the_parameter_server_roles(capsys, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    with pytest.raises(SystemExit) as exit_:
        launcher.main(["--role", "worker", "--ps_address", "127.0.0.1:7070", "--metrics_port",
                       "0", str(script)])
    assert exit_.value.code == 2 and "--metrics_port" in capsys.readouterr().err


def test_progress_interval_0_turns_the_lines_off_and_a_negative_one_is_refused(capsys,
                                                                               tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    args = launcher.build_parser().parse_args(["--progress_interval", "0", str(script)])
    launcher._check_args(args)
    with pytest.raises(SystemExit):
        launcher.main(["--progress_interval", "-1", str(script)])
    assert "--progress_interval must be >= 0" in capsys.readouterr().err


def test_the_agent_takes_a_workers_step_from_its_first_commit_and_feeds_its_metrics():
    """Before a commit a failure counts as one before the job's first step (a setup error
    every worker hits ends the job instead of being restarted)."""
    spec = WorkerSpec("train.py", [], "127.0.0.1:1", "job", NodeBounds(1, 2), nproc_per_node=2)
    metrics = WorkerMetrics("job")
    agent = LocalAgent(spec, mode=None, wake=threading.Event(), metrics=metrics,
                       stderr=io.StringIO())
    agent._view = View((1, 2), 1, 2, records=(NodeRecord(1, 1, 2), None))
    agent._take_in_reports()
    assert agent._progress.step is None
    assert metrics.registry.get_sample_value("tfelastic_worker_world_size", {"run_id": "job"}) == 2
    agent._view = View((1, 2), 1, 2, records=(NodeRecord(1, 1, 2, step=3), NodeRecord(2, 1, 2)))
    agent._take_in_reports()
    assert agent._progress.step == 3
    assert agent._progress.line() == "progress: step 3, world size 2"
