"""Keras `fit` over TFRecord files with a shuffle buffer, read by record index, across kills and
joins: every example exactly once per epoch, members agree, and the weights equal a
single-process `fit` over the same per-epoch order.

The workers are tests/training/keras_fit_worker.py reading the examples from TFRecord files,
directly (`TFRecordDataset(files)`, plain `model.fit` with the elastic callback) or through a
deterministic `interleave` of the file list (`fit_elastic`); Keras 3.
"""

import json
import os
import signal
import subprocess
import sys

import pytest

from tensorflow_elastic.rendezvous import Client
from tests.conftest import TESTS_DIR, wait_until
from tests.data.tfrecord_files import write_files
from tests.training.test_keras_fit_multiprocess import (ARGS, EXAMPLES, STEPS,
                                                         _check_against_the_reference, _node,
                                                         _results)

pytestmark = pytest.mark.multiprocess

FILES = 8


def _env(form: str, directory: str, plain_fit: bool) -> dict[str, str]:
    return {"TF_USE_LEGACY_KERAS": "0", "KERAS_FIT_PLAIN": "1" if plain_fit else "0",
            "KERAS_FIT_TFRECORD": form, "KERAS_FIT_TFRECORD_DIR": directory}


def _reference(subprocess_env, env) -> dict:
    run = subprocess.run([sys.executable, os.path.join(TESTS_DIR, "training/keras_fit_worker.py"),
                          *ARGS, "0"], env=dict(subprocess_env, KERAS_FIT_REFERENCE="1", **env),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(next(line for line in run.stdout.splitlines() if '"done"' in line))


@pytest.mark.parametrize("form, plain_fit", [("direct", True), ("interleave", False)])
def test_fit_over_tfrecord_files_exactly_once_across_kills_and_joins(
        orchestrator, start_workers, subprocess_env, tmp_path, form, plain_fit):
    data = tmp_path / "data"
    data.mkdir()
    write_files(str(data), [EXAMPLES // FILES] * FILES)
    hold = tmp_path / "hold"
    env = dict(_env(form, str(data), plain_fit), KERAS_FIT_OUT=str(tmp_path),
               KERAS_FIT_HOLD=str(hold))

    def start(count):
        return start_workers(orchestrator.endpoint, count, min_nodes=2, max_nodes=4,
                             script="training/keras_fit_worker.py", args=[*ARGS, "0.08"], env=env)

    workers = start(3)
    for w in workers:
        w.wait_for_step(8)
    member = _node(workers, max(w.node_id for w in workers))
    # The job is held until both newcomers wait to join: two TensorFlow processes starting on a
    # busy machine can take longer than the job's remaining steps.
    hold.touch()
    member.signal(signal.SIGKILL)
    survivors = [w for w in workers if w is not member]
    newcomer = start(1)[0]
    # Started now, while the job has most of its steps left: started after the chief's kill,
    # it could arrive after the survivors finished.
    second_newcomer = start(1)[0]
    status = Client(orchestrator.endpoint, run_id="job")
    wait_until(lambda: sum(n.role == "waiting" for n in status.status()[0].nodes) >= 2,
               timeout=60, what="the two newcomers waiting to join")
    hold.unlink()
    newcomer.wait_for_step(STEPS // 3)
    chief = _node(survivors, min(w.node_id for w in survivors))
    chief.signal(signal.SIGKILL)
    second_newcomer.wait_for_step(2 * STEPS // 3)
    finishers = [w for w in survivors if w is not chief] + [newcomer, second_newcomer]
    results = _results(finishers)
    _check_against_the_reference(results, _reference(subprocess_env, _env(form, str(data),
                                                                          plain_fit)))
