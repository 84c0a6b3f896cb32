"""The loops benchmarks/chaos.py hurts: the shapes users' training loops have.

Every workload trains on element ids (features computed from the id, float64,
so a single-process replay can be compared bit for bit up to summation order)
and counts, in a histogram summed across workers, how often each id (modulo
`bins`) was trained on: the end shows whether every sample was trained on
exactly once.

* ``linear``: linear regression in a custom loop; one all-reduce a step (the
  gradient and the histogram together), the loss reduced to the host, and
  `compute_ms` of CPU work between steps.
* ``multi``: the same model written the way many custom loops are: three
  collectives a step (the gradient's all-reduce; the histogram as a
  SUM-aggregated ON_WRITE variable updated with `assign_add` in replica
  context; `strategy.reduce` of the loss), then 40 ms of Python (a sleep) and
  a small file write every 5 steps.
* ``keras``: Keras `fit` of a small dense network (with dropout) with
  `tfe.keras.ElasticCallback`.
* ``cnn``: Keras `fit` of a small CNN with BatchNormalization (synchronized
  across replicas, so that its batch statistics are the global batch's, as in
  the replay) and dropout. The dropout mask is a function of the example id and
  the unit (`IdDropout`): stock `Dropout` draws its masks per replica, which no
  single-process replay can reproduce.

A workload object gives `variables()` (what `State` holds), `step(ids)` for the
custom loops or `fit(...)` for the Keras ones, and `weights()`/`counts()` at the end.
"""

from __future__ import annotations

import os
import time

import numpy as np
import tensorflow as tf

FEATURES = 8
LEARNING_RATE = 0.05
TRUE_WEIGHTS = np.linspace(-1.0, 1.0, FEATURES)
IMAGE = 8  # the CNN's images are IMAGE x IMAGE x 1
CLASSES = 4
PYTHON_MS = 40.0  # the multi-collective loop's Python work between steps
WRITE_EVERY = 5  # ... and its small file write


def features(ids: tf.Tensor) -> tf.Tensor:
    """The features of element ids (float64)."""
    k = np.arange(1, FEATURES // 2 + 1, dtype=np.float64)
    angles = tf.cast(ids, tf.float64)[:, None] * k[None, :] * 0.37
    return tf.concat([tf.sin(angles), tf.cos(angles)], axis=1)


def histogram(ids: tf.Tensor, bins: int) -> tf.Tensor:
    return tf.math.unsorted_segment_sum(tf.ones_like(ids, tf.float64), ids % bins, bins)


class Linear:
    """Linear regression; `between_steps()` is the loop's host work."""

    custom_loop = True

    def __init__(self, strategy, global_batch: int, bins: int, compute_ms: float, workdir: str):
        self.strategy, self.global_batch, self.bins = strategy, global_batch, bins
        self.compute_ms = compute_ms
        with strategy.scope():
            self.weights_var = tf.Variable(tf.zeros([FEATURES], tf.float64))
            self.counts_var = self._counts_variable()
        self.step = tf.function(self._step, input_signature=[tf.TensorSpec([None], tf.int64)])

    def _counts_variable(self) -> tf.Variable:
        return tf.Variable(tf.zeros([self.bins], tf.float64))

    def variables(self) -> list:
        return [self.weights_var, self.counts_var]

    def _gradient(self, ids):
        x = features(ids)
        y = tf.linalg.matvec(x, tf.constant(TRUE_WEIGHTS, tf.float64))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(tf.linalg.matvec(x, self.weights_var) - y)
                                 ) / self.global_batch
        return loss, tape.gradient(loss, self.weights_var)

    def _step(self, ids):
        def replica_step(ids):
            loss, grad = self._gradient(ids)
            grad, seen = tf.distribute.get_replica_context().all_reduce(
                "SUM", [grad, histogram(ids, self.bins)])
            self.weights_var.assign_sub(LEARNING_RATE * grad)
            self.counts_var.assign_add(seen)
            return loss

        return self.strategy.reduce("SUM", self.strategy.run(replica_step, args=(ids,)),
                                    axis=None)

    def between_steps(self, step: int, pid: int) -> None:
        """CPU work (what a real loop does between steps: logging, metrics, host-side input)."""
        a = np.random.RandomState(pid).rand(48, 48)
        end = time.perf_counter() + self.compute_ms / 1e3
        while time.perf_counter() < end:
            a = np.tanh(a @ a)

    def weights(self) -> list[float]:
        return self.weights_var.numpy().tolist()

    def counts(self) -> list[float]:
        return self.counts_var.numpy().tolist()


class MultiCollective(Linear):
    """Three collectives a step, then Python between steps."""

    def __init__(self, strategy, global_batch: int, bins: int, compute_ms: float, workdir: str):
        super().__init__(strategy, global_batch, bins, compute_ms, workdir)
        self.log_path = os.path.join(workdir, f"multi-log-{os.getpid()}.txt")

    def _counts_variable(self) -> tf.Variable:
        return tf.Variable(tf.zeros([self.bins], tf.float64),
                           synchronization=tf.VariableSynchronization.ON_WRITE,
                           aggregation=tf.VariableAggregation.SUM)

    def _step(self, ids):
        def replica_step(ids):
            loss, grad = self._gradient(ids)
            grad = tf.distribute.get_replica_context().all_reduce("SUM", grad)
            self.weights_var.assign_sub(LEARNING_RATE * grad)
            self.counts_var.assign_add(histogram(ids, self.bins))  # a SUM across replicas
            return loss

        return self.strategy.reduce("SUM", self.strategy.run(replica_step, args=(ids,)),
                                    axis=None)

    def between_steps(self, step: int, pid: int) -> None:
        time.sleep(PYTHON_MS / 1e3)
        if step % WRITE_EVERY == 0:
            with open(self.log_path, "a") as f:
                f.write(f"{step}\n")


class IdDropout(tf.keras.layers.Layer):
    """Dropout whose mask is a function of (example id, unit): the same in any split of a batch."""

    def __init__(self, rate: float, **kwargs):
        super().__init__(**kwargs)
        self.rate = rate

    def call(self, inputs, training=None):
        hidden, ids = inputs
        if not training:
            return hidden
        units = tf.range(tf.shape(hidden)[1], dtype=hidden.dtype)
        noise = tf.math.floormod(tf.sin(tf.cast(ids, hidden.dtype)[:, None] * 12.9898
                                        + units[None, :] * 78.233) * 43758.5453, 1.0)
        return tf.where(noise >= self.rate, hidden / (1.0 - self.rate), tf.zeros_like(hidden))


class KerasFit:
    """A Keras model of inputs (features, id) under `fit`, counting the ids it trains on."""

    custom_loop = False

    def __init__(self, strategy, global_batch: int, bins: int, compute_ms: float, workdir: str):
        keras = tf.keras
        keras.config.set_floatx("float64")
        self.strategy, self.global_batch, self.bins = strategy, global_batch, bins
        with strategy.scope():
            self.model = self._model(keras, bins)
            rng = np.random.RandomState(0)
            self.model.set_weights([rng.uniform(-0.3, 0.3, w.shape) if w.shape != (bins,)
                                    else np.zeros(w.shape) for w in self.model.get_weights()])
            self.model.compile(keras.optimizers.SGD(LEARNING_RATE), self._loss())

    def _model(self, keras, bins: int):
        x, ids = keras.Input((FEATURES,)), keras.Input((), dtype="int64")
        hidden = IdDropout(0.1)([keras.layers.Dense(16, activation="tanh")(x), ids])
        return CountingModel(bins, inputs=[x, ids], outputs=keras.layers.Dense(1)(hidden))

    def _loss(self):
        return "mse"

    def dataset(self, elements: int) -> tf.data.Dataset:
        """The global batches of ((inputs, id), label), as a plain `fit` would get them."""
        return tf.data.Dataset.range(elements).map(self._inputs).batch(self.global_batch)

    def _inputs(self, i):
        x = features(i[None])[0]
        return (x, i), tf.reduce_sum(x * TRUE_WEIGHTS)[None]

    def variables(self) -> list:
        return self.model.weights

    def weights(self) -> list[float]:
        return [float(x) for w in self.model.trainable_weights for x in np.reshape(w.numpy(), -1)]

    def counts(self) -> list[float]:
        return self.model.counts.numpy().tolist()


class Cnn(KerasFit):
    """Conv -> synchronized BatchNorm -> ReLU -> pool -> dense -> id dropout -> softmax."""

    def _model(self, keras, bins: int):
        image = keras.Input((IMAGE, IMAGE, 1))
        ids = keras.Input((), dtype="int64")
        h = keras.layers.Conv2D(6, 3, padding="same")(image)
        h = keras.layers.BatchNormalization(synchronized=True)(h)
        h = keras.layers.ReLU()(h)
        h = keras.layers.MaxPooling2D(2)(h)
        h = keras.layers.Flatten()(h)
        h = keras.layers.Dense(16, activation="relu")(h)
        h = IdDropout(0.25)([h, ids])
        return CountingModel(bins, inputs=[image, ids], outputs=keras.layers.Dense(CLASSES)(h))

    def _loss(self):
        return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def _inputs(self, i):
        x = tf.cast(i, tf.float64)
        grid = tf.range(IMAGE * IMAGE, dtype=tf.float64)
        image = tf.reshape(tf.sin(grid * (0.05 + tf.math.floormod(x, 7.0) * 0.03) + x * 0.1),
                           [IMAGE, IMAGE, 1])
        return (image, i), tf.math.floormod(i, CLASSES)


class CountingModel(tf.keras.Model):
    """A functional model whose train step also sums a histogram of the ids it trains on."""

    def __init__(self, bins: int, **kwargs):
        super().__init__(**kwargs)
        self.bins = bins
        self.counts = self.add_weight(name="counts", shape=(bins,), initializer="zeros",
                                      trainable=False, aggregation="only_first_replica")

    def train_step(self, data):
        (_, ids), _ = data
        seen = tf.distribute.get_replica_context().all_reduce("SUM", histogram(ids, self.bins))
        self.counts.assign_add(seen)
        return super().train_step(data)


WORKLOADS = {"linear": Linear, "multi": MultiCollective, "keras": KerasFit, "cnn": Cnn}
