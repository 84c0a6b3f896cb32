"""Backups as TensorFlow checkpoints through tf.io.gfile: local paths and TensorFlow's in-memory
filesystem (ram://), loadable by stock TensorFlow, keep-N, a later commit never overwritten."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_elastic as tfe
from tensorflow_elastic import world
from tensorflow_elastic.training import checkpoints


@pytest.fixture(params=["local", "ram"])
def backup_dir(request, tmp_path) -> str:
    if request.param == "local":
        return str(tmp_path / "backup")
    return f"ram://tfe-{uuid.uuid4().hex}/backup"


def committed_state(values: list[float], step: int) -> tfe.TensorFlowState:
    state = tfe.TensorFlowState([tf.Variable(values)], step=step)
    object.__setattr__(state, "_commits", step)
    state.save()
    return state


def files(path: str) -> list[str]:
    return sorted(tf.io.gfile.listdir(path))


def test_a_backup_round_trips_on_every_filesystem(backup_dir):
    assert not tfe.TensorFlowState([tf.Variable([0.0, 0.0])], step=0).read(backup_dir)
    assert committed_state([1.0, 2.0], 5).write(backup_dir)
    weights = tf.Variable([0.0, 0.0])
    fresh = tfe.TensorFlowState([weights], step=0)
    assert fresh.read(backup_dir)
    assert weights.numpy().tolist() == [1.0, 2.0] and (fresh.step, fresh.commits) == (5, 5)


def test_stock_tensorflow_loads_the_backup_into_its_own_variables(backup_dir):
    committed_state([3.0, 4.0], 7).write(backup_dir)
    latest = tf.train.latest_checkpoint(backup_dir)
    assert latest is not None and os.path.basename(latest).startswith("ckpt-7-")
    mine = tf.Variable([0.0, 0.0])
    tf.train.Checkpoint(variables=[mine]).read(latest).expect_partial()
    assert mine.numpy().tolist() == [3.0, 4.0]
    reader = tf.compat.v1.train.NewCheckpointReader(latest)
    assert b'"step": 7' in reader.get_tensor("meta/.ATTRIBUTES/VARIABLE_VALUE")


def test_a_keras_models_backup_loads_into_the_same_model_in_stock_tensorflow(tmp_path):
    def build():
        model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
        optimizer = tf.keras.optimizers.Adam(0.1)
        optimizer.build(model.trainable_variables)
        return model, optimizer

    model, optimizer = build()
    model.layers[0].kernel.assign(np.full((3, 2), 0.5, np.float32))
    state = tfe.KerasState(model, optimizer, epoch=1)
    state.write(str(tmp_path / "backup"))
    other, other_optimizer = build()
    tf.train.Checkpoint(variables=other.variables + other_optimizer.variables).read(
        tf.train.latest_checkpoint(str(tmp_path / "backup"))).expect_partial()
    np.testing.assert_array_equal(other.layers[0].kernel.numpy(), np.full((3, 2), 0.5))


def test_keep_n_keeps_the_latest_checkpoints_and_leaves_no_temporary_file(backup_dir):
    for step in (1, 2, 3, 4):
        assert committed_state([float(step)], step).write(backup_dir, keep=2)
    names = files(backup_dir)
    kept = sorted({name.split(".")[0] for name in names if name.startswith("ckpt-")})
    assert [name.split("-")[1] for name in kept] == ["3", "4"]
    assert "checkpoint" in names and not [name for name in names if name.endswith(".tmp")]
    assert checkpoints.saved_commits(backup_dir) == 4
    # The default keeps one: the new checkpoint replaces the old.
    assert committed_state([5.0], 5).write(backup_dir)
    assert sorted({n.split(".")[0] for n in files(backup_dir) if n.startswith("ckpt-")}) == [
        n for n in sorted({n.split(".")[0] for n in files(backup_dir)}) if n.startswith("ckpt-5-")]


def test_a_member_behind_never_overwrites_a_later_commit(backup_dir):
    assert committed_state([9.0], 9).write(backup_dir)
    assert not committed_state([4.0], 4).write(backup_dir)
    weights = tf.Variable([0.0])
    assert tfe.TensorFlowState([weights], step=0).read(backup_dir)
    assert weights.numpy().tolist() == [9.0]


def test_a_torn_pointer_reads_as_no_backup_and_is_replaced(tmp_path):
    path = str(tmp_path / "backup")
    committed_state([1.0], 3).write(path)
    (tmp_path / "backup" / "checkpoint").write_text('model_checkpoint_path: "ckpt-3')
    assert checkpoints.saved_commits(path) == -1
    assert not tfe.TensorFlowState([tf.Variable([0.0])], step=0).read(path)
    assert committed_state([2.0], 2).write(path)
    assert checkpoints.saved_commits(path) == 2


def test_the_custom_loop_helper_writes_every_n_commits_and_restores(backup_dir, monkeypatch):
    chief = [True]
    monkeypatch.setattr(world, "is_chief", lambda: chief[0])
    weights = tf.Variable([0.0])
    state = tfe.TensorFlowState([weights], step=0)
    backup = tfe.Backup(state, backup_dir, every=2, keep=2)
    assert not backup.restore()
    written = []
    for step in range(1, 6):
        weights.assign([float(step)])
        state.step = step
        object.__setattr__(state, "_commits", step)
        state.save()
        written.append(backup.after_commit())
    assert written == [False, True, False, True, False]
    chief[0] = False  # only the chief writes
    object.__setattr__(state, "_commits", 6)
    assert not backup.after_commit()
    restored = tf.Variable([0.0])
    again = tfe.Backup(tfe.TensorFlowState([restored], step=0), backup_dir)
    assert again.restore() and restored.numpy().tolist() == [4.0] and again.state.step == 4
    with pytest.raises(ValueError, match="every and keep"):
        tfe.Backup(state, backup_dir, every=0)


def test_a_backup_written_inside_a_strategys_scope_creates_no_variable(tmp_path):
    """Keras runs its callbacks (the chief's backup) in the strategy's scope, where a new
    variable would be a mirrored one whose creation waits for every member."""
    state = committed_state([6.0], 6)

    def refuse(next_creator, **kwargs):
        raise AssertionError("the backup created a variable")

    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope(), tf.variable_creator_scope(refuse):
        assert state.write(str(tmp_path / "backup"))
    weights = tf.Variable([0.0])
    assert tfe.TensorFlowState([weights], step=0).read(str(tmp_path / "backup"))
    assert weights.numpy().tolist() == [6.0]
