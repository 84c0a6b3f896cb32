"""The fork server (launch/fork_server.py) and the agent's side of it (launch/preloaded.py),
with a light preload (no TensorFlow) so each test starts a server in well under a second."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tensorflow_elastic.launch import fork_server, preloaded
from tensorflow_elastic.launch.spec import worker_env

WAIT_S = 60  # bounds against hangs, not timings


@pytest.fixture
def server():
    started = preloaded.ForkServer(worker_env({}), preload=["json"])
    yield started
    started.close()


def script(tmp_path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def run(server, argv, env=None, pass_fds=()):
    """Starts argv; (the process, its output, its error output, why fresh)."""
    proc, out, err, why = preloaded.start(argv, env or worker_env({}), pass_fds, server)
    with out, err:
        return proc, out.read().decode(), err.read().decode(), why


REPORT = """
    import json, os, sys
    fd = int(os.environ["PASSED_FD"])
    print(json.dumps({
        "argv": sys.argv, "cwd": os.getcwd(), "marker": os.environ.get("MARKER"),
        "own_session": os.getsid(0) == os.getpid(), "threads": len(os.listdir("/proc/self/task")),
        "name": __name__, "passed": os.read(fd, 100).decode(), "path0": sys.path[0],
        "fds": sorted(int(f) for f in os.listdir("/proc/self/fd"))}))
"""


def test_a_worker_gets_its_argv_environment_cwd_descriptors_and_session(server, tmp_path,
                                                                        monkeypatch):
    path = script(tmp_path, "report.py", REPORT)
    readable, writable = os.pipe()
    os.write(writable, b"hello")
    os.close(writable)
    workdir = tmp_path / "work"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    proc, out, err, why = run(server, [sys.executable, "-u", path, "--flag", "x"],
                              worker_env({"MARKER": "m1", "PASSED_FD": str(readable)}),
                              [readable])
    os.close(readable)
    assert (why, proc.wait(WAIT_S)) == ("", 0), err
    assert isinstance(proc, preloaded.ForkedProcess)
    seen = json.loads(out)
    assert seen["argv"] == [path, "--flag", "x"]
    assert seen["cwd"] == str(workdir)
    assert seen["marker"] == "m1"
    assert seen["own_session"] and seen["name"] == "__main__"
    assert seen["threads"] == 1
    assert seen["passed"] == "hello"
    assert seen["path0"] == str(tmp_path)
    # Its standard streams, what it was passed, and the descriptor os.listdir read: no server's.
    assert len(seen["fds"]) == 5, seen["fds"]


def test_a_module_runs_as_python_m_does(server, tmp_path, monkeypatch):
    (tmp_path / "mod_report.py").write_text("import sys; print(__name__, sys.argv[1:])")
    monkeypatch.chdir(tmp_path)
    proc, out, err, _ = run(server, [sys.executable, "-m", "mod_report", "a"])
    assert proc.wait(WAIT_S) == 0, err
    assert out.strip() == "__main__ ['a']"


@pytest.mark.parametrize("body, code", [
    ("import sys; sys.exit(3)", 3),
    ("import os; os._exit(5)", 5),
    ("raise ValueError('boom')", 1),
    ("import sys; sys.exit('a message')", 1),
    ("pass", 0),
])
def test_exit_codes_are_reported_as_a_process_s(server, tmp_path, body, code):
    proc, _, err, _ = run(server, [sys.executable, "-u", script(tmp_path, "w.py", body)])
    assert proc.wait(WAIT_S) == code
    if code == 1:
        assert "boom" in err or "a message" in err


def test_a_worker_ends_as_an_interpreter_does(server, tmp_path):
    body = """
        import atexit, threading, time
        atexit.register(lambda: print("exit handler", flush=True))
        threading.Thread(target=lambda: (time.sleep(0.2), print("thread done"))).start()
    """
    proc, out, _, _ = run(server, [sys.executable, script(tmp_path, "w.py", body)])
    assert proc.wait(WAIT_S) == 0
    assert out.split("\n")[:2] == ["thread done", "exit handler"]


def test_each_worker_draws_its_own_random_numbers(tmp_path):
    server = preloaded.ForkServer(worker_env({}), preload=["numpy.random", "random"])
    try:
        numpy_draw = script(tmp_path, "n.py", "import numpy; print(numpy.random.randint(1 << 30))")
        python_draw = script(tmp_path, "p.py", "import random; print(random.random())")
        draws = [{run(server, [sys.executable, path])[1] for _ in range(2)}
                 for path in (numpy_draw, python_draw)]
    finally:
        server.close()
    assert [len(d) for d in draws] == [2, 2], draws


def test_a_signal_s_death_is_reported_as_minus_the_signal(server, tmp_path):
    path = script(tmp_path, "w.py", "import time; print('up', flush=True); time.sleep(60)")
    proc, out, err, _ = preloaded.start([sys.executable, "-u", path], worker_env({}), [], server)
    with out, err:
        assert out.readline() == b"up\n"
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(WAIT_S) == -signal.SIGTERM
    with pytest.raises(subprocess.TimeoutExpired):
        preloaded.ForkedProcess(1).wait(0.01)


def test_a_different_start_up_environment_or_command_starts_a_fresh_process(server, tmp_path):
    path = script(tmp_path, "w.py", "import os; print(os.environ.get('PYTHONHASHSEED'))")
    proc, out, _, why = run(server, [sys.executable, "-u", path],
                            worker_env({"PYTHONHASHSEED": "7"}))
    assert isinstance(proc, subprocess.Popen) and proc.wait(WAIT_S) == 0
    assert out.strip() == "7"
    assert "PYTHONHASHSEED" in why
    proc, out, _, why = run(server, [sys.executable, "-c", "print(1)"])
    assert isinstance(proc, subprocess.Popen) and "not a plain Python command" in why


def test_a_crash_of_the_server_kills_its_workers_and_says_so(server, tmp_path):
    path = script(tmp_path, "w.py", "import time; print('up', flush=True); time.sleep(60)")
    proc, out, err, _ = preloaded.start([sys.executable, "-u", path], worker_env({}), [], server)
    with out, err:
        assert out.readline() == b"up\n"
        os.kill(server.pid, signal.SIGKILL)
        assert proc.wait(WAIT_S) == -signal.SIGKILL
    with pytest.raises(preloaded.ForkServerError, match=r"exited with code -9; workers start "
                                                        r"as fresh processes"):
        server.spawn(preloaded.python_program([sys.executable, path]), worker_env({}), ".", {})
    fresh, _, _, why = run(server, [sys.executable, "-c", "pass"])
    assert fresh.wait(WAIT_S) == 0


def test_a_server_whose_imports_start_a_thread_refuses_to_fork(tmp_path, capfd):
    (tmp_path / "starts_a_thread.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n")
    env = worker_env({"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get(
        "PYTHONPATH", "")])})
    server = preloaded.ForkServer(env, preload=["starts_a_thread"])
    try:
        with pytest.raises(preloaded.ForkServerError, match="cannot fork on this host: the "
                                                            "fork server has 2 threads"):
            server.spawn(preloaded.python_program([sys.executable, "x.py"]), env, ".", {})
    finally:
        server.close()
    assert "the fork server has 2 threads" in capfd.readouterr().err


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children", encoding="utf-8") as f:
        return [int(child) for child in f.read().split()]


def eventually(condition) -> bool:
    """Whether ``condition()`` holds within WAIT_S (a bound against hangs)."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def server_with_pidfd_open(tmp_path, fails_for: str):
    """A server whose os.pidfd_open fails (ENOSYS, as before Linux 5.3) for the pids that
    ``fails_for`` (an expression of ``pid``) selects; with its environment."""
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent(f"""
        import errno, os
        _pidfd_open = os.pidfd_open
        def _pidfd_open_or_not(pid, flags=0):
            if {fails_for}:
                raise OSError(errno.ENOSYS, "Function not implemented")
            return _pidfd_open(pid, flags)
        os.pidfd_open = _pidfd_open_or_not
    """))
    env = worker_env({"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get(
        "PYTHONPATH", "")])})
    return preloaded.ForkServer(env, preload=["json"]), env


def test_without_pidfds_the_server_refuses_to_start_and_workers_start_fresh(tmp_path, capfd):
    server, env = server_with_pidfd_open(tmp_path, "True")
    try:
        path = script(tmp_path, "w.py", "print('ran')")
        proc, out, _, why = run(server, [sys.executable, path], env)
        assert isinstance(proc, subprocess.Popen) and proc.wait(WAIT_S) == 0
        assert out == "ran\n"  # once: nothing was forked
        assert "cannot fork on this host" in why and "Linux 5.3 or later" in why, why
    finally:
        server.close()
    assert "needs pidfd_open" in capfd.readouterr().err


def test_a_worker_the_server_cannot_watch_is_killed_and_started_fresh(tmp_path):
    server, env = server_with_pidfd_open(tmp_path, "pid != os.getpid()")
    try:
        path = script(tmp_path, "w.py", "import time; time.sleep(600)")
        proc, out, err, why = preloaded.start([sys.executable, path], env, [], server)
        with out, err:
            assert isinstance(proc, subprocess.Popen)
            assert "cannot watch its worker" in why, why
            # The forked copy is gone (killed and reaped); the server serves on.
            assert children(server.pid) == [] and server.lost is None
            proc.kill()
            proc.wait(WAIT_S)
    finally:
        server.close()


def test_a_late_answer_s_worker_is_killed_and_the_server_serves_no_more(server, tmp_path):
    run(server, [sys.executable, script(tmp_path, "ready.py", "pass")])  # it is ready
    path = script(tmp_path, "w.py", "import time; time.sleep(600)")
    os.kill(server.pid, signal.SIGSTOP)  # as swapped out, or on a loaded host
    try:
        with pytest.raises(preloaded.ForkServerError, match="did not answer within 0 s; "
                                                            "workers start as fresh"):
            server.spawn(preloaded.python_program([sys.executable, path]), worker_env({}),
                         str(tmp_path), {}, timeout=0.2)
    finally:
        os.kill(server.pid, signal.SIGCONT)
    # It forks the request once it runs again: that worker is killed, so only the fresh copy
    # the agent starts instead runs.
    assert eventually(lambda: children(server.pid) == []), children(server.pid)
    fresh, _, _, why = run(server, [sys.executable, script(tmp_path, "p.py", "pass")])
    assert isinstance(fresh, subprocess.Popen) and "did not answer" in why


def test_an_environment_that_is_not_utf8_starts_a_fresh_process_leaking_nothing(server,
                                                                                  tmp_path):
    path = script(tmp_path, "w.py", "import os; print(os.environb[b'NOT_UTF8'])")
    env = worker_env({"NOT_UTF8": "caf\udce9"})  # a byte os.environ cannot decode
    open_before = len(os.listdir("/proc/self/fd"))
    proc, out, _, why = run(server, [sys.executable, path], env)
    assert isinstance(proc, subprocess.Popen) and proc.wait(WAIT_S) == 0
    assert out.strip() == "b'caf\\xe9'" and "not valid UTF-8" in why, why
    assert len(os.listdir("/proc/self/fd")) == open_before


def test_an_exited_worker_is_reaped_only_after_the_agent_noted_its_exit(server, tmp_path,
                                                                        monkeypatch):
    noted: list[int] = []
    monkeypatch.setattr(server, "_send_reap", noted.append)
    proc, _, _, _ = run(server, [sys.executable, script(tmp_path, "w.py", "pass")])
    assert proc.wait(WAIT_S) == 0 and eventually(lambda: noted == [proc.pid])
    # Reported but not reaped: its pid is not free, so a signal sent meanwhile reaches no
    # other process.
    with open(f"/proc/{proc.pid}/stat", encoding="utf-8") as f:
        assert f.read().rsplit(")", 1)[1].split()[0] == "Z"
    proc.send_signal(signal.SIGTERM)  # an exited worker gets no signal
    preloaded.ForkServer._send_reap(server, proc.pid)
    assert eventually(lambda: not os.path.exists(f"/proc/{proc.pid}"))


def test_only_a_plain_python_command_is_forked():
    python = sys.executable
    assert preloaded.python_program([python, "-u", "-m", "pkg.mod", "a"]) == \
        preloaded.PythonProgram(["pkg.mod", "a"], module=True, unbuffered=True)
    assert preloaded.python_program([python, "s.py", "-u"]) == \
        preloaded.PythonProgram(["s.py", "-u"], module=False, unbuffered=False)
    for command in ([python, "-O", "s.py"], [python, "-c", "x"], ["/bin/echo", "s.py"], [python]):
        assert preloaded.python_program(command) is None


def test_start_up_variables_must_match_others_may_differ():
    own = {"PYTHONPATH": "a", "TF_CPP_MIN_LOG_LEVEL": "3", "TFE_RUN_ID": "x"}
    assert fork_server.startup_differences(
        {"PYTHONPATH": "a", "TF_CPP_MIN_LOG_LEVEL": "3", "TFE_RUN_ID": "y", "CUDA_VISIBLE_DEVICES":
         "1"}, own) == []
    assert fork_server.startup_differences(
        {"PYTHONPATH": "b", "LD_PRELOAD": "x.so"}, own) == ["LD_PRELOAD", "PYTHONPATH",
                                                            "TF_CPP_MIN_LOG_LEVEL"]
