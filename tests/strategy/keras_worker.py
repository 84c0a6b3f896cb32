"""A worker of the Keras tests: `model.fit` under the elastic strategy.

`tf.keras` is Keras 3, or tf-keras when TF_USE_LEGACY_KERAS=1.

Prints a JSON line per committed batch and a final {"done": ...} line with the
weights, like elastic_worker.py. argv: epochs, steps per epoch, sleep per batch.
"""

import json
import os
import sys
import time

import numpy as np
import tensorflow as tf

import tensorflow_elastic as tfe
from tensorflow_elastic.training.keras import fit_elastic

EPOCHS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
STEPS_PER_EPOCH = int(sys.argv[2]) if len(sys.argv) > 2 else 20
BATCH_SLEEP_S = float(sys.argv[3]) if len(sys.argv) > 3 else 0.02

rng = np.random.RandomState(0)
features = rng.randn(2048, 16).astype(np.float32)
labels = (features.sum(axis=1) > 0).astype(np.int32)

runtime = tfe.init()
strategy = tfe.ElasticMultiWorkerMirroredStrategy()
keras = tf.keras
dataset = tf.data.Dataset.from_tensor_slices((features, labels)).repeat().batch(24)
with strategy.scope():
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.05),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
state = tfe.KerasState(model, model.optimizer, epoch=0, batch=0)


class Report(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        print(json.dumps({"node": runtime.node_id, "epoch": state.epoch, "batch": state.batch,
                          "step": state.epoch * STEPS_PER_EPOCH + state.batch,
                          "loss": float(logs["loss"]), "world": runtime.membership.world_size,
                          "generation": runtime.generation}), flush=True)
        time.sleep(BATCH_SLEEP_S)


@tfe.run
def train(state):
    fit_elastic(model, state, dataset, epochs=EPOCHS, steps_per_epoch=STEPS_PER_EPOCH,
                callbacks=[Report()], verbose=0)


train(state)
print(json.dumps({"done": True, "node": runtime.node_id,
                  "weights": [float(x) for w in model.get_weights() for x in w.reshape(-1)]}),
      flush=True)
sys.stdout.flush()
os._exit(0)
