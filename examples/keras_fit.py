"""An elastic Keras `model.fit`: nodes come and go inside the running processes.

    tfelastic-run --standalone --nproc_per_node 3 --nworkers 2:3 examples/keras_fit.py --epochs 5

A small classifier on synthetic data (no downloads), built and compiled under
the elastic strategy's scope and trained with `tfe.keras.fit_elastic` from a
plain batched `tf.data` pipeline: its `.batch(24)` is the global batch, cut
elastically among the workers, and every example is trained on exactly once
per epoch across failures and joins (docs/keras.md). The global batch (24)
divides by every world size the job can have (1, 2 or 3 workers), so the
weights are those of a single process training on the same batches. Each
worker prints one line per epoch: `epoch E loss L accuracy A world W`.

With --plain_fit the same training is a plain `model.fit` with the elastic
callback first in its list: an existing script needs only `@tfe.run` and that
callback. --csv_log PATH logs the epochs' metrics from the current chief only.
"""

import argparse
import time

import numpy as np
import tensorflow as tf

import tensorflow_elastic as tfe

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--steps_per_epoch", type=int, default=50)
parser.add_argument("--global_batch", type=int, default=24,
                    help="divisible by every world size the job can have")
parser.add_argument("--batch_sleep", type=float, default=0.0,
                    help="seconds of extra work per batch, to make a demo watchable")
parser.add_argument("--plain_fit", action="store_true",
                    help="model.fit with tfe.keras.ElasticCallback instead of fit_elastic")
parser.add_argument("--csv_log", help="a CSV file of the epochs' metrics (the chief writes it)")
args = parser.parse_args()

FEATURES = 16
runtime = tfe.init()  # before any TensorFlow op: it configures the collective runtime
strategy = tf.distribute.experimental.ElasticMultiWorkerMirroredStrategy()

# Synthetic data: the label says whether a fixed linear score is positive.
rng = np.random.RandomState(0)
features = rng.randn(4096, FEATURES).astype(np.float32)
labels = (features @ rng.randn(FEATURES).astype(np.float32) > 0).astype(np.int32)
# Endless (repeat): an epoch is --steps_per_epoch global batches of the stream.
dataset = tf.data.Dataset.from_tensor_slices((features, labels)).repeat().batch(args.global_batch)

keras = tf.keras
with strategy.scope():
    model = keras.Sequential([keras.Input((FEATURES,)),
                              keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.05),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
state = tfe.KerasState(model, model.optimizer, epoch=0, batch=0)


class Progress(keras.callbacks.Callback):
    """One printed line per epoch (the runtime itself records `step` events at commits)."""

    def on_train_batch_end(self, batch, logs=None):
        if args.batch_sleep:
            time.sleep(args.batch_sleep)

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        print(f"epoch {epoch + 1} loss {logs.get('loss', float('nan')):.4f} "
              f"accuracy {logs.get('accuracy', float('nan')):.3f} "
              f"world {runtime.membership.world_size}", flush=True)


callbacks = [Progress()]
if args.csv_log:
    # ChiefOnly: the current chief writes it, a new chief appends to it.
    callbacks.append(tfe.keras.ChiefOnly(keras.callbacks.CSVLogger(args.csv_log), state))


@tfe.run
def train(state):
    if args.plain_fit:
        model.fit(dataset, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=0,
                  callbacks=[tfe.keras.ElasticCallback(state), *callbacks])
    else:
        tfe.keras.fit_elastic(model, state, dataset, epochs=args.epochs,
                              steps_per_epoch=args.steps_per_epoch, callbacks=callbacks,
                              verbose=0)


# A node joining a running job runs a step of fit alone first, while the members train.
tfe.keras.warm_up(model, dataset)
train(state)
print(f"done: {state.epoch} epochs", flush=True)
