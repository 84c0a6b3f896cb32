"""Under the elastic strategy a Keras 3 metric reset is each worker's own: no all-reduce that
every worker must join (a node beginning its `fit` call would need the members' reset)."""

import numpy as np
import pytest
import tensorflow as tf
from keras.src.backend.tensorflow import core as keras_tf_core

from tensorflow_elastic.training import keras as tfe_keras


def _trained(strategy):
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
        model.compile(tf.keras.optimizers.SGD(0.1), "mse", metrics=["mae"])
    model.fit(np.ones((8, 2)), np.full((8, 1), 3.0), epochs=1, verbose=0)
    return model


def _reductions(monkeypatch, strategy):
    done = []
    reduce_to = type(strategy.extended)._reduce_to

    def counted(extended, *args, **kwargs):
        done.append(1)
        return reduce_to(extended, *args, **kwargs)

    monkeypatch.setattr(type(strategy.extended), "_reduce_to", counted)
    return done


@pytest.mark.parametrize("elastic", [True, False])
def test_a_metric_reset_reads_nothing_back_across_the_workers_under_the_elastic_strategy(
        monkeypatch, elastic):
    """Loading tfe.keras is enough: no `fit` with the elastic callback ran before the reset."""
    strategy = tf.distribute.MirroredStrategy(["CPU:0"])
    model = _trained(strategy)
    variables = [v for metric in model.metrics for v in metric.variables]
    assert any(float(v.numpy()) != 0.0 for v in variables)
    # The elastic strategy needs a running job: this one stands in for it where it is asked.
    monkeypatch.setattr(tfe_keras, "_is_elastic", lambda extended: elastic)
    reductions = _reductions(monkeypatch, strategy)
    model.reset_metrics()
    assert len(reductions) == (0 if elastic else len(variables))
    assert all(float(v.numpy()) == 0.0 for v in variables)


def test_the_assign_is_replaced_once_however_often_it_is_installed(monkeypatch):
    """A second install leaves the replacement as it is: no replacement of the replacement."""
    keras_own = keras_tf_core.Variable._direct_assign.__wrapped__
    # Both restored after the test: the replacement loading tfe.keras installed stays.
    monkeypatch.setattr(keras_tf_core.Variable, "_direct_assign", keras_own)
    monkeypatch.setattr(tfe_keras, "_metric_assign_installed", False)
    assert tfe_keras._set_metrics_without_reading_them_back()
    assert tfe_keras._set_metrics_without_reading_them_back()
    assert keras_tf_core.Variable._direct_assign.__wrapped__ is keras_own


def test_a_keras_without_the_assign_keeps_its_own_and_says_so(monkeypatch, caplog):
    monkeypatch.setattr(keras_tf_core.Variable, "_direct_assign", None)
    monkeypatch.setattr(tfe_keras, "_metric_assign_installed", False)
    assert not tfe_keras._set_metrics_without_reading_them_back()
    assert "Keras metric resets stay collectives across the workers" in caplog.text
    assert keras_tf_core.Variable._direct_assign is None
