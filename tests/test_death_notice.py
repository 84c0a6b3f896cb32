"""A worker's death notice (tensorflow_elastic/death_notice.py): the agent's side learns of a
death that skips the interpreter's exit, and of nothing else (not an exec, not a forked child's
exit); a notice that cannot be used stays off."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from tensorflow_elastic import environment
from tensorflow_elastic.death_notice import DeathNotice

# Holds the notice passed down, says so, then does what argv[1] says.
_WORKER = (
    "import os, sys, time\n"
    "from tensorflow_elastic import death_notice, environment\n"
    "holder = death_notice.holder_from_env(environment.pop(environment.DEATH_NOTICE_FD))\n"
    "if sys.argv[1] != 'never': holder.hold()\n"
    "print('holding', flush=True)\n"
    "if sys.argv[1] == 'wait': time.sleep(600)\n"
    "if sys.argv[1] == 'crash': os._exit(3)\n"
    "if sys.argv[1] == 'exit': holder.release()\n"
    "if sys.argv[1] == 'exec': os.execv(sys.executable, [sys.executable, '-c', sys.argv[2]])\n"
    "if sys.argv[1] == 'fork':\n"
    "    child = os.fork()\n"
    "    if child == 0:\n"
    "        holder.release()\n"  # as the runtime's exit hook does in a child exiting through Python
    "        os._exit(0)\n"
    "    os.waitpid(child, 0)\n"
    "    print('forked', flush=True)\n"
    "    time.sleep(600)\n")
# What the worker execs: another program, which says so and waits.
_EXECED = "import time; print('execed', flush=True); time.sleep(600)"


@pytest.fixture
def notice():
    made = DeathNotice.make()
    if made is None:
        pytest.skip("robust process-shared mutexes need Linux with glibc")
    return made


def _worker(notice: DeathNotice, how: str, *args: str) -> tuple[subprocess.Popen, threading.Event]:
    env = dict(os.environ, **{environment.DEATH_NOTICE_FD: str(notice.fd)})
    proc = subprocess.Popen([sys.executable, "-c", _WORKER, how, *args], env=env,
                            pass_fds=[notice.fd], stdout=subprocess.PIPE, text=True)
    notice.passed()
    died = threading.Event()
    notice.watch(proc.pid, lambda: proc.poll() is None, died.set)
    assert proc.stdout.readline().strip() == "holding"
    return proc, died


def test_a_killed_worker_is_noticed(notice):
    proc, died = _worker(notice, "wait")
    os.kill(proc.pid, signal.SIGKILL)
    assert died.wait(30)
    proc.wait(30)


def test_a_worker_that_dies_without_the_interpreter_s_exit_is_noticed(notice):
    proc, died = _worker(notice, "crash")
    assert died.wait(30)
    assert proc.wait(30) == 3


@pytest.mark.parametrize("how", ["exit", "never"])
def test_a_normal_exit_or_a_worker_that_never_held_it_is_no_death(notice, how):
    proc, died = _worker(notice, how)
    assert proc.wait(30) == 0
    watchers = [t for t in threading.enumerate() if t.name == "tfe-death-notice"]
    for t in watchers:
        t.join(30)
    assert not died.is_set()


def _watchers_done() -> None:
    for t in [t for t in threading.enumerate() if t.name == "tfe-death-notice"]:
        t.join(30)


def test_an_exec_into_a_program_that_does_not_hold_it_is_no_death(notice):
    proc, died = _worker(notice, "exec", _EXECED)
    assert proc.stdout.readline().strip() == "execed"
    assert not died.wait(1.0)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    _watchers_done()
    assert not died.is_set()


def test_a_forked_child_s_exit_leaves_its_parent_s_notice_on(notice):
    proc, died = _worker(notice, "fork")
    assert proc.stdout.readline().strip() == "forked"
    os.kill(proc.pid, signal.SIGKILL)
    assert died.wait(30)
    proc.wait(30)


def test_no_usable_descriptor_no_holder():
    from tensorflow_elastic.death_notice import holder_from_env
    assert holder_from_env(None) is None and holder_from_env("") is None
    assert holder_from_env("not a number") is None
    unused = os.open(os.devnull, os.O_RDONLY)
    os.close(unused)
    assert holder_from_env(str(unused)) is None  # closed: no notice, no error


def test_an_inherited_number_that_names_another_file_is_left_alone(tmp_path):
    # A wrapper started the script with subprocess (descriptors closed), the variable survived,
    # and the number now names one of the program's own files.
    from tensorflow_elastic.death_notice import SHARED_BYTES, holder_from_env
    path = tmp_path / "data.bin"
    path.write_bytes(b"x" * (4 * SHARED_BYTES))
    fd = os.open(path, os.O_RDWR)
    try:
        assert holder_from_env(str(fd)) is None
        os.fstat(fd)  # still open: the program's file was not closed
    finally:
        os.close(fd)
    assert path.read_bytes() == b"x" * (4 * SHARED_BYTES)  # nor written
