"""Workers that drive several replicas (2 logical CPU devices each, or a mix of 1 and 2): a
member and the chief SIGKILLed, newcomers joining, in a custom loop and in Keras `fit`.

Every example is trained on exactly once, every replica of every member holds the same
values, and the weights equal those of one process over the same global batches.
"""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import TESTS_DIR

pytestmark = pytest.mark.multiprocess

SCRIPT = "strategy/local_devices_worker.py"
# 12 and 60 divide into every replica count the runs pass through, so every replica's slice
# is as large (Keras averages each replica's loss).
LOOP_ARGS = ["1200", "12", "0.1"]      # 100 steps
KERAS_ARGS = ["3600", "60", "0.15"]    # 60 steps

_references: dict[str, dict] = {}


def _reference(subprocess_env, mode: str, args: list[str]) -> dict:
    """The single-process run's result (once per mode)."""
    if mode not in _references:
        run = subprocess.run([sys.executable, os.path.join(TESTS_DIR, SCRIPT), *args],
                             env=dict(subprocess_env, REFERENCE="1", MODE=mode),
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr
        _references[mode] = json.loads(next(line for line in run.stdout.splitlines()
                                            if '"done"' in line))
    return _references[mode]


def _start(start_workers, orchestrator, devices: list[int], mode: str, args: list[str],
           max_nodes: int = 3) -> list:
    return [start_workers(orchestrator.endpoint, 1, min_nodes=2, max_nodes=max_nodes,
                          script=SCRIPT, args=args,
                          env={"LOCAL_DEVICES": str(count), "MODE": mode})[0]
            for count in devices]


def _check(survivors, reference, steps: int) -> None:
    """Every survivor finished; every replica of every member equal; each example once; the
    single-process weights."""
    for w in survivors:
        assert w.wait() == 0, w.log_tail()
    results = [w.result for w in survivors]
    for result in results:
        for copies, first in zip(result["copies"], results[0]["copies"]):
            for copy in copies:
                np.testing.assert_array_equal(copy, first[0])
    assert reference["counts"] == [1.0] * len(reference["counts"])
    assert results[0]["counts"] == reference["counts"], "an example was lost or trained twice"
    np.testing.assert_allclose(results[0]["weights"], reference["weights"], rtol=1e-5, atol=1e-6)
    assert max(w.steps[-1]["step"] for w in survivors) == steps


def _check_replica_slices(workers, global_batch: int, steps: int) -> None:
    """Each global batch, as the latest generation that ran it cut it: replicas in the order
    of their members' ids then their devices, each a contiguous run, together the batch."""
    records = [r for w in workers for r in w.records if "batch" in r]
    for step in range(1, steps + 1):
        runs = [r for r in records if r["batch"] == step]
        latest = max(r["generation"] for r in runs)
        parts = [part for r in sorted((r for r in runs if r["generation"] == latest),
                                      key=lambda r: r["node"]) for part in r["ids"]]
        assert [i for part in parts for i in part] == list(
            range((step - 1) * global_batch, step * global_batch)), step
        sizes = [len(part) for part in parts]
        assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True), step


def test_custom_loop_two_devices_each_a_member_and_the_chief_killed_a_newcomer_joins(
        orchestrator, start_workers, subprocess_env):
    reference = _reference(subprocess_env, "loop", LOOP_ARGS)
    first = _start(start_workers, orchestrator, [2, 2, 2], "loop", LOOP_ARGS)
    for w in first:
        w.wait_for_step(5)
    assert {w.steps[-1]["replicas"] for w in first} == {6}
    member = max(first, key=lambda w: w.node_id)
    member.signal(signal.SIGKILL)
    newcomer = _start(start_workers, orchestrator, [2], "loop", LOOP_ARGS)[0]
    newcomer.wait_for_step(newcomer.wait_for_step(1)["step"] + 3)
    chief = min(first, key=lambda w: w.node_id)
    chief.signal(signal.SIGKILL)
    survivors = [w for w in first if w not in (member, chief)] + [newcomer]
    _check(survivors, reference, 100)
    _check_replica_slices(first + [newcomer], 12, 100)
    assert survivors[0].steps[-1]["replicas"] == 4


def test_custom_loop_workers_of_one_and_two_devices(orchestrator, start_workers,
                                                   subprocess_env):
    reference = _reference(subprocess_env, "loop", LOOP_ARGS)
    first = _start(start_workers, orchestrator, [2, 1], "loop", LOOP_ARGS)
    for w in first:
        w.wait_for_step(5)
    assert {w.steps[-1]["replicas"] for w in first} == {3}
    newcomer = _start(start_workers, orchestrator, [1], "loop", LOOP_ARGS)[0]
    newcomer.wait_for_step(newcomer.wait_for_step(1)["step"] + 3)
    assert newcomer.steps[-1]["replicas"] == 4
    chief = min(first, key=lambda w: w.node_id)
    chief.signal(signal.SIGKILL)
    survivors = [w for w in first if w is not chief] + [newcomer]
    _check(survivors, reference, 100)
    _check_replica_slices(first + [newcomer], 12, 100)


def test_keras_fit_two_devices_each_a_member_and_the_chief_killed_a_newcomer_of_one_joins(
        orchestrator, start_workers, subprocess_env):
    reference = _reference(subprocess_env, "keras", KERAS_ARGS)
    first = _start(start_workers, orchestrator, [2, 2, 2], "keras", KERAS_ARGS)
    for w in first:
        w.wait_for_step(3)
    assert {w.steps[-1]["replicas"] for w in first} == {6}
    member = max(first, key=lambda w: w.node_id)
    member.signal(signal.SIGKILL)
    newcomer = _start(start_workers, orchestrator, [1], "keras", KERAS_ARGS)[0]
    newcomer.wait_for_step(newcomer.wait_for_step(1)["step"] + 3)
    assert newcomer.steps[-1]["replicas"] == 5
    chief = min(first, key=lambda w: w.node_id)
    chief.signal(signal.SIGKILL)
    survivors = [w for w in first if w not in (member, chief)] + [newcomer]
    _check(survivors, reference, 60)
