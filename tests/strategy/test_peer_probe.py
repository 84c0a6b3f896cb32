import json
import os
import socket
import subprocess
import sys

import pytest

from tensorflow_elastic import net

pytestmark = pytest.mark.multiprocess

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def test_a_probe_of_a_silent_peer_lets_the_other_python_threads_run():
    # Heartbeats are Python threads: a probe that held the interpreter lock for its timeout
    # silenced them as long, and a worker probing two silent peers outlived its heartbeat
    # timeout.
    own = net.hold_port("127.0.0.1")
    silent = socket.create_server(("127.0.0.1", 0), backlog=16)  # accepts, never answers
    members = {0: f"127.0.0.1:{own.getsockname()[1]}",
               1: f"127.0.0.1:{silent.getsockname()[1]}"}
    own.close()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    try:
        done = subprocess.run([sys.executable, os.path.join(HERE, "probe_worker.py"),
                               json.dumps(members)], capture_output=True, text=True, env=env,
                              timeout=120)
    finally:
        silent.close()
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["answered"] == {"0": True, "1": False}
    assert result["unreachable"] == [1]
    # The counting thread sleeps 10 ms a turn: during a probe of 1.5 s it turns about 150
    # times when the probe lets it run, and not at all when the probe holds the lock.
    assert result["silent_probe_s"] >= 1.0, result
    assert result["turns_during"] >= 0.25 * result["silent_probe_s"] / 0.01, result


def test_news_of_a_lost_peer_before_tensorflow_started_aborts_nothing_and_starts_nothing():
    script = ("from tensorflow.python.eager import context\n"
              "from tensorflow_elastic.strategy import cluster\n"
              "cluster.abort_collectives('a peer left before this process built its strategy')\n"
              "print(context.context()._initialized)\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["False"]  # the user's device settings can still be made
