"""Under the elastic strategy a Keras 3 metric reset is each worker's own: no all-reduce that
every worker must join (a node beginning its `fit` call would need the members' reset)."""

import numpy as np
import pytest
import tensorflow as tf

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
    strategy = tf.distribute.MirroredStrategy(["CPU:0"])
    model = _trained(strategy)
    variables = [v for metric in model.metrics for v in metric.variables]
    assert any(float(v.numpy()) != 0.0 for v in variables)
    if elastic:  # what the elastic strategy has, and Keras' loss scaling reads too
        monkeypatch.setattr(strategy.extended, "replicas_variable", tf.Variable(1),
                            raising=False)
    assert tfe_keras._set_metrics_without_reading_them_back()
    reductions = _reductions(monkeypatch, strategy)
    model.reset_metrics()
    assert len(reductions) == (0 if elastic else len(variables))
    assert all(float(v.numpy()) == 0.0 for v in variables)
