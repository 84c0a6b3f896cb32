"""ChiefOnly in one process: which member runs the wrapped callback (the chief is faked)."""

import pytest
import tensorflow as tf

import tensorflow_elastic as tfe
from tensorflow_elastic.training import keras as keras_lib


@pytest.fixture
def checkpoint(tmp_path, monkeypatch):
    monkeypatch.setattr(keras_lib, "_is_chief", lambda: False)
    model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
    callback = tf.keras.callbacks.ModelCheckpoint(str(tmp_path / "best.weights.h5"),
                                                  monitor="val_loss", save_best_only=True,
                                                  save_weights_only=True)
    wrapped = tfe.keras.ChiefOnly(callback, tfe.State(epoch=0, batch=0))
    wrapped.set_model(model)
    wrapped.set_params({"epochs": 4, "steps": 1, "verbose": 0})
    return wrapped, tmp_path / "best.weights.h5"


def test_a_member_writes_nothing_and_a_new_chief_saves_only_what_beats_the_best(
        checkpoint, monkeypatch):
    wrapped, path = checkpoint
    wrapped.on_epoch_end(0, {"val_loss": 0.5})
    assert not path.exists() and wrapped.callback.best == 0.5
    # Keras 3 compares from its second epoch's end on (it had never run on this member).
    wrapped.on_epoch_end(1, {"val_loss": 0.6})
    assert not path.exists() and wrapped.callback.best == 0.5
    # The chief died: this one leads from the next `fit` call, which sets the model again.
    monkeypatch.setattr(keras_lib, "_is_chief", lambda: True)
    wrapped.set_model(wrapped.model)
    wrapped.on_epoch_end(2, {"val_loss": 0.7})
    assert not path.exists() and wrapped.callback.best == 0.5
    wrapped.on_epoch_end(3, {"val_loss": 0.4})
    assert path.exists() and wrapped.callback.best == 0.4


def test_only_the_chief_gives_the_callback_the_model(tmp_path, monkeypatch):
    """Keras 3's TensorBoard writes the model's summary when it is given the model."""
    model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
    wrapped = tfe.keras.ChiefOnly(tf.keras.callbacks.TensorBoard(str(tmp_path / "logs")),
                                  tfe.State(epoch=0, batch=0))
    monkeypatch.setattr(keras_lib, "_is_chief", lambda: False)
    wrapped.set_model(model)
    assert wrapped.callback.model is None and not (tmp_path / "logs").exists()
    monkeypatch.setattr(keras_lib, "_is_chief", lambda: True)
    wrapped.set_model(model)
    assert wrapped.callback.model is model
    assert len(list((tmp_path / "logs").rglob("events.*"))) == 1


def test_a_member_that_becomes_chief_during_a_fit_call_begins_the_callback_there(
        tmp_path, monkeypatch):
    """Its predecessor was lost and the `fit` call went on (the failed batch ran again in
    place): the CSV log is opened, the epoch begun, and the epoch's row written, here."""
    monkeypatch.setattr(keras_lib, "_is_chief", lambda: False)
    model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
    log = tf.keras.callbacks.CSVLogger(str(tmp_path / "log.csv"))
    wrapped = tfe.keras.ChiefOnly(log, tfe.State(epoch=1, batch=3))
    wrapped.set_model(model)
    wrapped.set_params({"epochs": 2, "steps": 8, "verbose": 0})
    wrapped.on_train_begin()
    wrapped.on_epoch_begin(1)
    wrapped.on_train_batch_end(0)
    assert log.model is None and not (tmp_path / "log.csv").exists()
    monkeypatch.setattr(keras_lib, "_is_chief", lambda: True)
    wrapped.on_train_batch_end(1)
    wrapped.on_epoch_end(1, {"loss": 0.5})
    wrapped.on_train_end()
    assert log.model is model and log.append, "the predecessor's log is continued"
    header, row = (tmp_path / "log.csv").read_text().splitlines()
    assert header.startswith("epoch,loss") and row.startswith("1,0.5")


def test_outside_a_fit_call_a_new_chief_begins_no_training(tmp_path, monkeypatch):
    """`evaluate` with the callback, after the `fit` call that set its model ended."""
    monkeypatch.setattr(keras_lib, "_is_chief", lambda: True)
    model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
    log = tf.keras.callbacks.CSVLogger(str(tmp_path / "log.csv"))
    wrapped = tfe.keras.ChiefOnly(log, tfe.State(epoch=0, batch=0))
    wrapped.set_model(model)
    wrapped.on_test_begin()
    assert not (tmp_path / "log.csv").exists()


def test_a_newcomer_joins_before_a_chief_only_callback_listed_first_asks_who_leads(
        tmp_path, monkeypatch):
    """With a join left to the `fit` call's start (tfe.keras.warm_up), the first elastic
    callback to begin makes it: a standby node would otherwise take itself for the chief."""
    from types import SimpleNamespace

    from tensorflow_elastic.strategy import runtime as runtime_lib

    happened = []
    monkeypatch.setattr(runtime_lib, "_runtime",
                        SimpleNamespace(join_in_step=lambda: happened.append("joined")))
    monkeypatch.setattr(keras_lib, "_is_chief", lambda: happened.append("asked") or False)
    model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
    wrapped = tfe.keras.ChiefOnly(tf.keras.callbacks.CSVLogger(str(tmp_path / "log.csv")),
                                  tfe.State(epoch=0, batch=0))
    wrapped.set_model(model)
    happened.clear()
    wrapped.on_train_begin()
    assert happened == ["joined", "asked"]
