"""The models of benchmarks/recovery.py: from the tiny MLP to a ResNet-50, each trained with Adam.

Each model is a set of variables (weights plus Adam's two slots per weight:
the state a commit holds and a newcomer receives) and a replica step that
all-reduces its gradients (the vote rides on that all-reduce) and applies one
Adam update. Adam is written out here rather than taken from Keras so that
stock MultiWorkerMirroredStrategy and the elastic strategy run exactly the same
update with the same collectives; like Keras 3's Adam it updates the weights and
both slots in place, so a snapshot held over a step costs a copy of all three.
Inputs are synthetic and fixed (seeded), so a step costs the same from one run
to the next.

| name        | what                                             | parameters | state with Adam |
|-------------|--------------------------------------------------|-----------:|----------------:|
| tiny        | MLP 32-64-64-1 (the benchmark's original model)  |      6.5 K |          0.08 MB|
| wide        | MLP 32-2048-2048-1                               |      4.3 M |            52 MB|
| transformer | 3-layer encoder, d_model 512, 8 heads, ff 2048   |      9.5 M |   114 MB (~100) |
| resnet50    | keras.applications.ResNet50(weights=None), 32x32 |     23.6 M |           283 MB|

"transformer" is the "~100 MB model" of the goals. benchmarks/recovery.py
holds each model's global batch and how many steps each phase runs.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
import tensorflow as tf


def _tf_variable(variable):
    """The tf.Variable a Keras 3 variable wraps (what Keras' TensorFlow optimizers update)."""
    return variable.value if isinstance(variable, tf.keras.Variable) else variable


class Adam:
    """Adam over a fixed list of variables, its slots created in the current strategy's scope."""

    def __init__(self, variables: list, learning_rate: float = 1e-3, beta1: float = 0.9,
                 beta2: float = 0.999, epsilon: float = 1e-7):
        self._variables = variables
        self._lr, self._beta1, self._beta2, self._epsilon = learning_rate, beta1, beta2, epsilon
        self.m = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False) for v in variables]
        self.v = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False) for v in variables]
        self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False)

    @property
    def variables(self) -> list:
        return self.m + self.v + [self.iterations]

    def apply(self, grads: list) -> None:
        """One update (in replica context, with the all-reduced gradients)."""
        self.iterations.assign_add(1)
        t = tf.cast(self.iterations, tf.float32)
        lr = self._lr * tf.sqrt(1 - self._beta2 ** t) / (1 - self._beta1 ** t)
        for var, g, m, v in zip(self._variables, grads, self.m, self.v):
            # In place, as Keras 3's Adam does: each update writes into the variable's buffer
            # (copy-on-write while a snapshot shares it). A Keras variable's own assign_sub
            # would assign a new buffer; Keras' optimizers update the tf.Variable inside it.
            m.assign_add((g - m) * (1 - self._beta1))
            v.assign_add((tf.square(g) - v) * (1 - self._beta2))
            _tf_variable(var).assign_sub(lr * m / (tf.sqrt(v) + self._epsilon))


@dataclasses.dataclass
class Model:
    """What a benchmark worker needs of a model."""

    state_variables: list  # everything a commit holds and a newcomer receives
    replica_step: Callable  # (x, y) -> loss, in replica context
    features: tf.Tensor
    targets: tf.Tensor


def _mlp(rng: np.random.RandomState, widths: list[int]):
    layers = []
    for fan_in, fan_out in zip(widths, widths[1:]):
        layers += [tf.Variable((rng.randn(fan_in, fan_out) / np.sqrt(fan_in)).astype(np.float32)),
                   tf.Variable(tf.zeros([fan_out]))]

    def forward(x, training):
        for i in range(0, len(layers), 2):
            x = x @ layers[i] + layers[i + 1]
            if i + 2 < len(layers):
                x = tf.nn.relu(x)
        return x

    return layers, forward


def _transformer(rng: np.random.RandomState):
    keras = tf.keras
    d_model, heads, ff, layers, seq, width = 512, 8, 2048, 3, 16, 64
    inputs = keras.Input((seq, width))
    x = keras.layers.Dense(d_model)(inputs)
    for _ in range(layers):
        attention = keras.layers.MultiHeadAttention(heads, d_model // heads)(x, x)
        x = keras.layers.LayerNormalization()(x + attention)
        hidden = keras.layers.Dense(ff, activation="relu")(x)
        x = keras.layers.LayerNormalization()(x + keras.layers.Dense(d_model)(hidden))
    outputs = keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(x))
    model = keras.Model(inputs, outputs)
    return model, rng.randn(256, seq, width).astype(np.float32)


def _resnet50(rng: np.random.RandomState):
    model = tf.keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3), classes=1,
                                           classifier_activation=None)
    return model, rng.randn(256, 32, 32, 3).astype(np.float32)


def build(name: str, global_batch: int) -> Model:
    """Builds model `name` (see SETTINGS) in the current strategy's scope."""
    rng = np.random.RandomState(0)
    if name in ("tiny", "wide"):
        hidden = 64 if name == "tiny" else 2048
        weights, forward = _mlp(rng, [32, hidden, hidden, 1])
        features = rng.randn(8192, 32).astype(np.float32)
        other: list = []
    elif name in ("transformer", "resnet50"):
        keras_model, features = _transformer(rng) if name == "transformer" else _resnet50(rng)
        weights = list(keras_model.trainable_variables)
        other = list(keras_model.non_trainable_variables)

        def forward(x, training):
            return keras_model(x, training=training)
    else:
        raise ValueError(f"unknown model {name!r}; choose tiny, wide, transformer or resnet50")
    adam = Adam(weights)
    targets = (rng.randn(len(features), 1) > 0).astype(np.float32)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            logits = forward(x, True)
            loss = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(y, logits)) / global_batch
        grads = tf.distribute.get_replica_context().all_reduce("SUM", tape.gradient(loss, weights))
        adam.apply(grads)
        return loss

    return Model(weights + other + adam.variables, replica_step, tf.constant(features),
                 tf.constant(targets))


def state_bytes(variables: list) -> int:
    """Bytes of the state a commit holds (and a sync moves)."""
    return sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in variables)
