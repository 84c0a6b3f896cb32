"""Keras `fit` under real membership changes: every example trained on exactly once per epoch.

Real worker processes (tests/training/keras_fit_worker.py) train a Keras model
over a plain batched and shuffled `tf.data` input: with `fit_elastic` under
Keras 3, with a plain `model.fit` and the elastic callback under tf-keras. A
member and then the chief are SIGKILLed mid-epoch and new nodes join, with a
misconfigured node, a newcomer that dies in its state sync and one whose sync
fails with a shape mismatch (InvalidArgumentError) past the layout check; the
per-example counts the model keeps (summed over all workers inside the train
step) must equal the number of epochs, all members must hold the same
weights, and the weights must equal a single-process `fit` over the same
global batches (the same per-epoch shuffle). The CSV log and the checkpoint
are written by the current chief only, and complete.
"""

import csv
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from tensorflow_elastic.rendezvous import Client
from tests.conftest import TESTS_DIR, wait_until

pytestmark = pytest.mark.multiprocess

EPOCHS, EXAMPLES, GLOBAL_BATCH = 3, 480, 12  # 40 global batches per epoch
ARGS = [str(EPOCHS), str(EXAMPLES), str(GLOBAL_BATCH)]
STEPS = EPOCHS * EXAMPLES // GLOBAL_BATCH


def _flavor_env(legacy: bool) -> dict[str, str]:
    # tf-keras trains with a plain model.fit and the elastic callback, Keras 3 with fit_elastic.
    return {"TF_USE_LEGACY_KERAS": "1" if legacy else "0", "KERAS_FIT_PLAIN": "1" if legacy else "0"}


_references: dict[bool, dict] = {}


def _reference(subprocess_env, legacy: bool) -> dict:
    """The single-process run's result (run once per flavor)."""
    if legacy not in _references:
        env = dict(subprocess_env, KERAS_FIT_REFERENCE="1", **_flavor_env(legacy))
        run = subprocess.run([sys.executable,
                              os.path.join(TESTS_DIR, "training/keras_fit_worker.py"), *ARGS, "0"],
                             env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stdout + run.stderr
        _references[legacy] = json.loads(next(line for line in run.stdout.splitlines()
                                              if '"done"' in line))
    return _references[legacy]


def _check_against_the_reference(results, reference):
    """Exactly once, equal members, the single-process weights, and evaluate, predict and the
    validation of the last epoch over the whole validation set."""
    assert reference["counts"] == {str(EPOCHS): EXAMPLES}
    assert reference["iterations"] == STEPS
    for result in results:
        assert result["iterations"] == STEPS, "the optimizer's step is not the global step"
        assert result["counts"] == {str(EPOCHS): EXAMPLES}
        assert result["weights"] == results[0]["weights"], "members disagree on the weights"
        assert result["val_loss"] == pytest.approx(reference["val_loss"], rel=1e-3)
        assert result["evaluated"] == pytest.approx(reference["evaluated"], rel=1e-3)
        np.testing.assert_allclose(result["predicted"], reference["predicted"], rtol=1e-3,
                                   atol=1e-5)
    np.testing.assert_allclose(results[0]["weights"], reference["weights"], rtol=1e-4, atol=1e-5)


def _node(workers, node_id):
    return next(w for w in workers if w.node_id == node_id)


@pytest.mark.parametrize("legacy", [False, True], ids=["keras3", "tf_keras"])
def test_fit_trains_every_example_exactly_once_per_epoch_across_kills_and_joins(
        orchestrator, start_workers, subprocess_env, tmp_path, legacy):
    hold = tmp_path / "hold"

    def start(count, **env):
        return start_workers(orchestrator.endpoint, count, min_nodes=2, max_nodes=6,
                             script="training/keras_fit_worker.py", args=[*ARGS, "0.08"],
                             env=dict(_flavor_env(legacy), KERAS_FIT_OUT=str(tmp_path),
                                      KERAS_FIT_HOLD=str(hold), **env))

    workers = start(3)
    for w in workers:
        w.wait_for_step(8)
    member = _node(workers, max(w.node_id for w in workers))
    # The job is held until the newcomers wait to join: five TensorFlow processes starting at
    # once on a busy machine can take longer than the job's remaining steps.
    hold.touch()
    member.signal(signal.SIGKILL)
    survivors = [w for w in workers if w is not member]
    first_newcomer = start(1)[0]
    # A healthy newcomer joins with failing ones, likely in the same state sync: it must finish.
    second_newcomer = start(1)[0]
    misfit = start(1, KERAS_FIT_EXTRA_WEIGHT="1")[0]
    dying = start(1, KERAS_FIT_DIE_IN_SYNC="1")[0]
    misshapen = start(1, KERAS_FIT_BAD_SYNC="1")[0]
    status = Client(orchestrator.endpoint, run_id="job")
    wait_until(lambda: sum(n.role == "waiting" for n in status.status()[0].nodes) >= 5,
               timeout=60, what="the five newcomers waiting to join")
    hold.unlink()
    first_newcomer.wait_for_step(STEPS // 3)
    chief = _node(survivors, min(w.node_id for w in survivors))
    chief.signal(signal.SIGKILL)
    second_newcomer.wait_for_step(2 * STEPS // 3)
    finishers = [w for w in survivors if w is not chief] + [first_newcomer, second_newcomer]
    assert misfit.wait() != 0
    assert "StateLayoutMismatch" in misfit.log_tail(), misfit.log_tail()
    assert "extra" in misfit.log_tail(), misfit.log_tail()
    assert dying.wait() == -signal.SIGKILL, dying.log_tail()
    assert misshapen.wait() != 0
    assert "could not be synced from the members'" in misshapen.log_tail(), misshapen.log_tail()
    results = _results(finishers)
    _check_against_the_reference(results, _reference(subprocess_env, legacy))
    _check_files_of_the_current_chief(tmp_path, results, _node(finishers, min(
        w.node_id for w in finishers)), earlier_chiefs=[chief])
    for newcomer in (first_newcomer, second_newcomer):
        # Traced in its warm-up, before it joined (generation 0); under Keras 3 that one trace
        # serves every world size: its steps in the job traced nothing.
        assert newcomer.result["traced_in"][0] == 0
        if not legacy:
            assert newcomer.result["traced_in"] == [0]


def _results(workers) -> list[dict]:
    results = []
    for w in workers:
        assert w.wait() == 0, w.log_tail()
        assert w.result is not None, w.log_tail()
        results.append(w.result)
    return results


@pytest.mark.parametrize("legacy", [False, True], ids=["keras3", "tf_keras"])
def test_a_job_restarted_as_a_whole_resumes_from_the_chiefs_backup(
        orchestrator, start_workers, subprocess_env, tmp_path, legacy):
    """Every worker is SIGKILLed mid-epoch; a new job reads the state the chief wrote at the last
    epoch's end and finishes: still every example exactly once per epoch, the weights (and the
    learning rate, which follows the optimizer's iterations) of an uninterrupted run."""
    def start(count, run_id):
        return start_workers(orchestrator.endpoint, count, min_nodes=2, max_nodes=2,
                             script="training/keras_fit_worker.py", args=[*ARGS, "0.02"],
                             run_id=run_id, env=dict(_flavor_env(legacy), KERAS_FIT_BACKUP="1",
                                                     KERAS_FIT_OUT=str(tmp_path)))

    first = start(2, "first")
    for w in first:
        w.wait_for_step(STEPS // 2)
    assert (tmp_path / "state.npz").exists()
    for w in first:
        w.signal(signal.SIGKILL)
    for w in first:
        w.wait()
    second = start(2, "second")
    results = _results(second)
    assert all(w.steps[0]["step"] > STEPS // 3 for w in second), "the job started over"
    _check_against_the_reference(results, _reference(subprocess_env, legacy))
    _check_files_of_the_current_chief(tmp_path, results, _node(second, min(
        w.node_id for w in second)), earlier_chiefs=[_node(first, min(w.node_id for w in first))])


def _check_files_of_the_current_chief(out, results, chief, earlier_chiefs):
    """The surviving member that became chief wrote the CSV log on from where its predecessor
    stopped (one header, every epoch, in order); nobody else wrote; its last checkpoint holds
    the final weights; TensorBoard's event files come from the chiefs alone, the last one
    included."""
    chief_id = chief.node_id
    writers = sorted(r["node"] for r in results if r["wrote_csv"])
    assert writers == [chief_id], f"the CSV log was written by {writers}, not only the chief"
    with open(out / "log.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0][0] == "epoch" and all(len(row) == len(rows[0]) for row in rows), rows
    epochs = [int(row[0]) for row in rows[1:]]
    # A chief lost between writing an epoch's row and committing the epoch's end has that
    # epoch redone: its row may repeat, right after itself.
    assert [e for i, e in enumerate(epochs) if i == 0 or e != epochs[i - 1]] == \
        list(range(EPOCHS)), rows
    chief_result = next(r for r in results if r["node"] == chief_id)
    assert chief_result["checkpoint_weights"] == chief_result["weights"]
    # events.out.tfevents.<time>.<host>.<pid>.<n>.v2; tf-keras' own non-chief writes go to
    # workertemp_<n> directories it removes at the end of a `fit` (one a re-form cut short
    # stays).
    event_files = [path for path in (out / "tensorboard").rglob("events.out.tfevents.*")
                   if not any(part.startswith("workertemp_") for part in path.parts)]
    pids = {int(path.name.split(".")[-3]) for path in event_files}
    assert chief.proc.pid in pids, (chief.proc.pid, event_files)
    assert pids <= {chief.proc.pid, *(w.proc.pid for w in earlier_chiefs)}, (pids, event_files)
