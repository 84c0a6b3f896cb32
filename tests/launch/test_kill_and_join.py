"""The smallest elastic job with a failure: two workers, one SIGKILLed, a newcomer in its place.

CI also runs it against the package as pip installs it, with each supported TensorFlow
(tools/test_installed.sh).
"""

import os
import re
import signal

import pytest

pytestmark = pytest.mark.multiprocess

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CUSTOM_LOOP = os.path.join(REPO_ROOT, "examples", "custom_loop.py")
STEPS = 300


def test_two_workers_one_killed_a_newcomer_joins_and_the_job_finishes(start):
    proc = start("--standalone", "--nworkers=1:2", "--nproc_per_node=2", "--max_restarts=1",
                 "--monitor_interval=0.5", CUSTOM_LOOP, f"--steps={STEPS}", "--step_sleep=0.05")
    first_nodes = {int(m.group(1)) for m in proc.wait_for(r"^\[node (\d+)\] step 50 ", count=2)}
    os.kill(proc.worker_pids()[1][0], signal.SIGKILL)
    assert proc.wait(240) == 0, proc.output
    assert len(proc.worker_pids()[1]) == 2  # the victim's place was started again, once
    done_nodes = {int(m.group(1)) for m in proc.wait_for(rf"^\[node (\d+)\] done: {STEPS} steps",
                                                         count=2)}
    assert len(done_nodes - first_nodes) == 1, "the newcomer did not finish as a new node"
    assert re.search(r"node\(s\) \[\d+\] lost \(\w+Error\); 1 member\(s\)", proc.output), proc.output
    assert re.search(r"node\(s\) \[\d+\] joined; 2 member\(s\)", proc.output), proc.output


def test_with_a_fork_server_the_workers_and_the_replacement_are_forked_and_train(start):
    proc = start("--standalone", "--nworkers=1:2", "--nproc_per_node=2", "--max_restarts=1",
                 "--monitor_interval=0.5", "--fork_server", CUSTOM_LOOP, f"--steps={STEPS}",
                 "--step_sleep=0.05")
    first_nodes = {int(m.group(1)) for m in proc.wait_for(r"^\[node (\d+)\] step 50 ", count=2)}
    os.kill(proc.worker_pids()[1][0], signal.SIGKILL)
    assert proc.wait(240) == 0, proc.output
    done_nodes = {int(m.group(1)) for m in proc.wait_for(rf"^\[node (\d+)\] done: {STEPS} steps",
                                                         count=2)}
    assert len(done_nodes - first_nodes) == 1, "the newcomer did not finish as a new node"
    started = re.findall(r"\[agent\] worker \d+ started: pid \d+, .*", proc.output)
    assert len(started) == 3 and all("forked from the fork server" in s for s in started), \
        proc.output
    assert re.search(r"node\(s\) \[\d+\] joined; 2 member\(s\)", proc.output), proc.output
