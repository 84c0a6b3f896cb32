"""Unit tests of the agent's and the timeline's pieces (no cluster, no orchestrator)."""

import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from tensorflow_elastic.errors import TrainingDiverged
from tensorflow_elastic.launch import tensorflowrun
from tensorflow_elastic.launch.console import ConsoleFilter
from tensorflow_elastic.launch.error_files import WorkerFailure, root_cause_summary, write_error_file
from tensorflow_elastic.launch.hosts import Cooldown
from tensorflow_elastic.launch.ports import PortAllocator
from tensorflow_elastic.launch.process import WorkerProcess
from tensorflow_elastic.launch.ps_roles import ParameterServerRoles
from tensorflow_elastic.launch.restart import tf_config
from tensorflow_elastic.launch.spec import (IN_PROCESS, RESTART, WorkerSpec, malloc_tunables,
                                           parse_nnodes, worker_env)
from tensorflow_elastic.observability import StepReporter, events, plot, timeline
from tensorflow_elastic.observability.progress import PS_SOURCE, ProgressTracker
from tensorflow_elastic.rendezvous import Membership
from tensorflow_elastic.rendezvous.types import NodeBounds


def test_nnodes_forms():
    assert parse_nnodes("3") == NodeBounds(3, 3) and parse_nnodes("2:4") == NodeBounds(2, 4)
    for bad in ("0", "4:2", "a", "1:2:3"):
        with pytest.raises(ValueError):
            parse_nnodes(bad)


def test_tf_config_ranks_members_by_node_id():
    m = Membership(None, 3, {7: "h:7", 2: "h:2", 5: "h:5"}, 2)
    config = json.loads(tf_config(m, 5))
    assert config == {"cluster": {"worker": ["h:2", "h:5", "h:7"]},
                      "task": {"type": "worker", "index": 1}}


def test_mode_is_detected_from_the_script(tmp_path):
    elastic, plain = tmp_path / "a.py", tmp_path / "b.py"
    elastic.write_text("import tensorflow_elastic as tfe\nruntime = tfe.init()\n")
    plain.write_text("import tensorflow as tf\ntf.distribute.MultiWorkerMirroredStrategy()\n")
    spec = dict(args=[], rdzv_endpoint="h:1", run_id="r", bounds=NodeBounds(1, 1))
    assert WorkerSpec(str(elastic), **spec).resolved_mode()[0] == IN_PROCESS
    assert WorkerSpec(str(plain), **spec).resolved_mode()[0] == RESTART
    assert WorkerSpec(str(elastic), mode=RESTART, **spec).resolved_mode()[0] == RESTART


def test_root_cause_is_the_earliest_failure_with_its_traceback(tmp_path):
    try:
        raise KeyError("missing feature")
    except KeyError as e:
        write_error_file(e, str(tmp_path / "error.json"))
    late = WorkerFailure(1, 4, 101, -9, time=2e9, output_tail=["last line"])
    early = WorkerFailure.collect(0, 3, 100, 1, str(tmp_path / "error.json"), ["ignored"])
    text = root_cause_summary([late, early], "title")
    first, others = text.split("Other failures:")
    assert "node:       3" in first and "KeyError: 'missing feature'" in first
    assert 'raise KeyError("missing feature")' in first
    assert "node 4 (local rank 1, pid 101): killed by SIGKILL" in others


def test_an_error_that_ends_the_job_by_design_is_its_message_and_is_not_restartable(tmp_path):
    try:
        raise TrainingDiverged("the training diverged: the loss became inf at iteration 3")
    except TrainingDiverged as e:
        write_error_file(e, str(tmp_path / "error.json"))
    failure = WorkerFailure.collect(2, None, 100, 1, str(tmp_path / "error.json"), ["ignored"],
                                    name="PS worker")
    other = WorkerFailure(0, None, 101, -9, time=2e9, name="PS worker")
    assert not failure.restartable and other.restartable
    text = root_cause_summary([other, failure], "title")
    assert "  worker:     PS worker\n" in text and "traceback" not in text
    assert "cause:      exit code 1: TrainingDiverged: the training diverged: the loss" in text
    assert "  PS worker (local rank 0, pid 101): killed by SIGKILL" in text
    assert failure.brief == "exit code 1: TrainingDiverged"
    assert "node" not in text


def test_cooldown_doubles_up_to_the_maximum():
    cooldown = Cooldown(base_s=10, max_s=25)
    assert [cooldown.record_failure("h") for _ in range(3)] == [10, 20, 25]
    assert cooldown.cooling("h") and not cooldown.cooling("other")


def _write(path, entries):
    log = events.EventLog(str(path))
    for e in entries:
        log.record(**e)
    log.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line, e in zip(lines, entries):
        line["time"] = e["t"]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_timeline_merges_an_incident_and_measures_recovery_and_lost_steps(tmp_path):
    path = tmp_path / "events.jsonl"
    _write(path, [
        dict(event="generation_start", generation=1, world_size=3, t=100.0),
        dict(event="step", node=0, step=10, t=101.0),
        dict(event="step", node=1, step=10, t=101.0),
        dict(event="step", node=0, step=20, t=102.0),
        dict(event="failure_detected", failed=[2], cause="killed", t=102.5),
        dict(event="failure_detected", failed=[2], cause="unreachable", t=102.6),
        dict(event="generation_start", generation=2, world_size=2, t=103.0),
        dict(event="step", node=0, step=15, t=104.0),
        dict(event="step", node=0, step=25, t=105.0),
        dict(event="node_joined", node=3, t=106.0),
        dict(event="job_complete", t=107.0),
    ])
    result = timeline.load(str(path))
    assert result.world == [(100.0, 3), (103.0, 2)]
    assert [s for _, s in result.steps] == [10, 20, 15, 25]
    [incident] = result.incidents
    assert incident.failed == [2] and incident.recovery_s == pytest.approx(1.5)
    assert incident.lost_steps == 5
    text = timeline.summary(result)
    assert "job completed" in text and "recovered in <= 1.50 s, lost steps 5" in text
    png = tmp_path / "t.png"
    plot.plot_timeline(result, str(png))
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_step_reporter_and_progress_line(tmp_path):
    path = tmp_path / "events.jsonl"
    reporter = StepReporter(every=10, path=str(path))
    for step in range(1, 36):
        reporter.report(step, world_size=2)
    assert [e["step"] for e in events.read_events(str(path), events.STEP)] == [1, 11, 21, 31]
    tracker = ProgressTracker(str(path))
    assert tracker.line().startswith("progress: step 31, world size 2")
    ps_events = events.EventLog(str(tmp_path / "ps.jsonl"), source=PS_SOURCE)
    for version in (50, 100):
        ps_events.record(events.STEP, version=version, step=version, workers=3)
    assert ProgressTracker(ps_events.path).line() == "progress: parameter version 100, 3 PS worker(s)"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="holds no events"):
        timeline.load(str(empty))


def test_held_addresses_take_the_first_port_when_free_then_any():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        first = probe.getsockname()[1]
    allocator = PortAllocator("127.0.0.1", first)
    address, held = allocator.held_address()
    assert address == f"127.0.0.1:{first}" and held.getsockname()[1] == first
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", first))
    taken = PortAllocator("127.0.0.1", first)
    other_address, other_held = taken.held_address()
    assert other_address != address and other_held.getsockname()[1] != first
    held.close()
    other_held.close()


# What one survivor printed around a recovery in a real demo run (examples/demo.py).
_RECOVERY_OUTPUT = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795480192.775578   17905 port.cc:153] oneDNN custom operations are on.",
    "step 100 loss 0.0322 world 3",
    "E0000 00:00:1795480200.820397   18202 base_collective_executor.cc:252] "
    "BaseCollectiveExecutor::StartAbort UNAVAILABLE: recvmsg:Connection reset by peer",
    "Additional GRPC error information from remote target /job:worker/replica:0/task:0 while "
    "calling /tensorflow.WorkerService/CompleteInstance:",
    ':UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"recvmsg:Connection reset"}',
    "2026-11-23 10:00:00.123456: W tensorflow/core/kernels/collective_ops.cc:12] Aborting",
    "WARNING:absl:Enabling collective ops after program startup may cause error when accessing "
    "previously created tensors.",
    "generation 2: node(s) [0] lost (UnavailableError); 2 member(s); recovered in 0.09 s",
    "step 150 loss 0.0217 world 2",
    "F0000 00:00:1795480201.000000   18202 env.cc:10] Check failed: a fatal error",
    "Traceback (most recent call last):",
    '  File "train.py", line 3, in <module>',
]


def test_the_console_shows_the_workers_lines_and_hides_tensorflow_s_own():
    console = ConsoleFilter()
    shown = [line for line in _RECOVERY_OUTPUT if console.shows(line)]
    assert shown == [
        "step 100 loss 0.0322 world 3",
        "generation 2: node(s) [0] lost (UnavailableError); 2 member(s); recovered in 0.09 s",
        "step 150 loss 0.0217 world 2",
        "F0000 00:00:1795480201.000000   18202 env.cc:10] Check failed: a fatal error",
        "Traceback (most recent call last):",
        '  File "train.py", line 3, in <module>',
    ]


def test_verbose_shows_every_line():
    console = ConsoleFilter(verbose=True)
    assert all(console.shows(line) for line in _RECOVERY_OUTPUT)


def test_a_worker_s_whole_output_goes_to_its_log_file_and_the_console_gets_the_rest(tmp_path):
    script = "import sys\n" + "".join(f"print({line!r})\n" for line in _RECOVERY_OUTPUT[:6])
    console, log_file = io.StringIO(), tmp_path / "worker_0" / "output.log"
    worker = WorkerProcess([sys.executable, "-c", script], dict(os.environ), "", lambda: "node 1",
                           stdout=console, stderr=console, log_file=str(log_file))
    assert worker.wait_output(timeout=30) == 0
    assert log_file.read_text().splitlines() == _RECOVERY_OUTPUT[:6]
    assert console.getvalue() == "[node 1] step 100 loss 0.0322 world 3\n"
    assert worker.tail() == ["step 100 loss 0.0322 world 3"]


def test_a_killed_worker_can_be_reaped_when_its_exit_wakes_the_agent():
    """The kernel closes a killed process's output a moment before the process can be reaped: a
    poll at the wake-up must see the exit, or the agent learns it a monitor interval later."""
    script = ("import threading, time\nblock = bytearray(200 << 20)\n"
              "for _ in range(40): threading.Thread(target=time.sleep, args=(60,), daemon=True)"
              ".start()\nprint('ready', flush=True)\ntime.sleep(60)\n")
    for _ in range(5):
        ready, polled = threading.Event(), []
        console = io.StringIO()
        worker = WorkerProcess([sys.executable, "-c", script], dict(os.environ), "",
                               lambda: "node 1", stdout=console, stderr=console,
                               on_exit=lambda: polled.append(_reapable(worker.pid)))
        while "ready" not in console.getvalue():
            ready.wait(0.01)
        os.kill(worker.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while len(polled) < 2 and time.monotonic() < deadline:  # stdout's and stderr's
            ready.wait(0.01)
        assert polled == [True, True], polled
        assert worker.wait_output(timeout=30) == -signal.SIGKILL


def _reapable(pid: int) -> bool:
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def test_the_ps_roles_pass_the_token_and_the_tls_trust_to_their_processes():
    spec = WorkerSpec("train.py", [], "", "job", NodeBounds(1, 1), token="s3cret", tls_ca="/etc/ca.pem")
    env = ParameterServerRoles(spec, "worker", "127.0.0.1:7070").launch(0).env
    assert env["TFE_RDZV_TOKEN"] == "s3cret" and env["TFE_RDZV_TLS_CA"] == "/etc/ca.pem"
    assert "TFE_RDZV_TOKEN" not in ParameterServerRoles(
        WorkerSpec("train.py", [], "", "job", NodeBounds(1, 1)), "ps", "127.0.0.1:7070").launch(0).env


@pytest.mark.parametrize("host, flag", [("10.0.0.5", "10.0.0.5"), ("fd00::5", "[fd00::5]")])
def test_tensorflowrun_gives_agents_an_address_they_read_as_a_host(host, flag):
    assert tensorflowrun._bracketed(host) == flag


def test_workers_malloc_asks_for_huge_pages_unless_told_otherwise():
    assert malloc_tunables(None) == "glibc.malloc.hugetlb=1"
    assert malloc_tunables("glibc.malloc.arena_max=2") == \
        "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    assert malloc_tunables("glibc.malloc.hugetlb=0") == "glibc.malloc.hugetlb=0"
    assert malloc_tunables("glibc.malloc.hugetlb=2:glibc.malloc.arena_max=2") == \
        "glibc.malloc.hugetlb=2:glibc.malloc.arena_max=2"


_HUGE_PAGES_IN_USE = (
    "b = bytearray(64 << 20)\n"
    "for i in range(0, len(b), 4096): b[i] = 1\n"
    "print(sum(int(line.split()[1]) for line in open('/proc/self/smaps')\n"
    "          if line.startswith('AnonHugePages:')))\n")


def test_a_worker_s_large_allocations_land_in_huge_pages(monkeypatch):
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            if "[never]" in f.read():
                pytest.skip("transparent huge pages are off on this machine")
    except OSError:
        pytest.skip("this kernel has no transparent huge pages")
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    huge_kb = int(subprocess.run([sys.executable, "-c", _HUGE_PAGES_IN_USE], env=worker_env({}),
                                 capture_output=True, text=True, timeout=60).stdout)
    assert huge_kb >= 32 << 10, huge_kb
    off = worker_env({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})
    assert off["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=0"
