"""ElasticCallback ends an epoch Keras cannot count (TFRecord files) by `stop_training`, in one
process: the epoch ends, the training goes on, unless another callback stopped it."""

import pytest
import tensorflow as tf

import tensorflow_elastic as tfe


@pytest.fixture
def callback():
    """The callback at its epoch's last batch, with an input Keras cannot count."""
    callback = tfe.keras.ElasticCallback(tfe.State(epoch=0, batch=0), steps_per_epoch=1)
    callback._stop_every_epoch = True  # what on_train_begin decides for such an input
    callback.set_model(tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)]))
    callback.model.stop_training = False
    return callback


def test_the_epoch_ends_and_the_training_goes_on(callback):
    callback.on_train_batch_end(0)
    assert callback.model.stop_training
    callback.on_epoch_end(0)
    assert not callback.model.stop_training
    assert (callback.state.epoch, callback.state.batch) == (1, 0)


@pytest.mark.parametrize("when", ["at the last batch", "at the epoch's end"])
def test_a_callback_that_stops_the_training_is_not_undone(callback, when):
    stopper = tf.keras.callbacks.EarlyStopping(monitor="loss", patience=0)
    stopper.set_model(callback.model)
    if when == "at the last batch":  # TerminateOnNaN's moment
        callback.on_train_batch_end(0)
        callback.model.stop_training = True
    else:  # EarlyStopping's, placed before the elastic callback
        callback.on_train_batch_end(0)
        stopper.on_train_begin()
        stopper.on_epoch_end(0, {"loss": 1.0})
        stopper.on_epoch_end(1, {"loss": 2.0})
        assert callback.model.stop_training is True
    callback.on_epoch_end(0)
    assert callback.model.stop_training


def test_a_newcomer_joins_before_the_callback_reads_where_training_is(monkeypatch):
    """The join's sync gives the state the members' (epoch, batch): the callback resumes there,
    and reads the world size only after the join."""
    from types import SimpleNamespace

    from tensorflow_elastic.strategy import runtime as runtime_lib
    from tensorflow_elastic.training import keras as keras_lib

    state = tfe.State(epoch=0, batch=0)
    happened = []

    def join():
        state.epoch, state.batch = 2, 5
        happened.append("joined")

    strategy = SimpleNamespace(extended=SimpleNamespace(latest_input=None))
    monkeypatch.setattr(runtime_lib, "_runtime",
                        SimpleNamespace(strategy=strategy, join_in_step=join, training=True))
    monkeypatch.setattr(keras_lib, "_follow_world_size",
                        lambda model, strategy: happened.append("world size"))
    callback = tfe.keras.ElasticCallback(state, steps_per_epoch=8)
    callback.set_model(tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)]))
    callback.set_params({"epochs": 3, "steps": 8, "verbose": 0})
    callback.on_train_begin()
    assert happened == ["joined", "world size"]
    assert callback.model._initial_epoch == 2 and callback._first_batch == 5
