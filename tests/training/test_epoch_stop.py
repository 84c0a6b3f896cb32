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
