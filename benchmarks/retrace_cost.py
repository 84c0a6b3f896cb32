"""What a retrace after every membership change would cost (the alternative we avoid).

The elastic strategy keeps traced functions across re-forms (collectives read
group size and key at call time). Stock MultiWorkerMirroredStrategy bakes
them in, so each re-form would need every tf.function traced again. This
measures, in one process under a (single-worker) MultiWorkerMirroredStrategy,
the first call of a fresh function (trace + run) minus a steady call, for the
MLP step of benchmarks/recovery_worker.py and for a Keras 3 train function.
Last line JSON: {"mlp_retrace_s": ..., "keras_retrace_s": ...} (medians).
"""

import argparse
import json
import os
import statistics

from harness import durations

parser = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("repeats", nargs="?", type=int, default=5,
                    help="measurements of each function (default 5)")
REPEATS = parser.parse_args().repeats

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

strategy = tf.distribute.MultiWorkerMirroredStrategy()
rng = np.random.RandomState(0)
x = tf.constant(rng.randn(48, 32).astype(np.float32))
y = tf.constant((rng.randn(48, 1) > 0).astype(np.float32))


def first_call_minus_steady(make_function, call) -> float:
    fn = make_function()
    first = durations(lambda: call(fn), 1)[0]
    return first - statistics.median(durations(lambda: call(fn), 20))


with strategy.scope():
    layers = [tf.Variable(rng.randn(32, 64).astype(np.float32) * 0.1), tf.Variable(tf.zeros([64])),
              tf.Variable(rng.randn(64, 64).astype(np.float32) * 0.1), tf.Variable(tf.zeros([64])),
              tf.Variable(rng.randn(64, 1).astype(np.float32) * 0.1), tf.Variable(tf.zeros([1]))]


def make_mlp_step():
    @tf.function
    def step(x, y):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                h = tf.nn.relu(x @ layers[0] + layers[1])
                h = tf.nn.relu(h @ layers[2] + layers[3])
                logits = h @ layers[4] + layers[5]
                loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(y, logits))
            grads = tf.distribute.get_replica_context().all_reduce(
                "SUM", tape.gradient(loss, layers))
            for v, g in zip(layers, grads):
                v.assign_sub(0.1 * g)
            return loss

        return strategy.run(replica_step, args=(x, y))

    return step


with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(64, activation="relu"),
                                 tf.keras.layers.Dense(64, activation="relu"),
                                 tf.keras.layers.Dense(1)])
    model.compile("sgd", tf.keras.losses.BinaryCrossentropy(from_logits=True))
model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(48), epochs=1, verbose=0)


def make_keras_train_function():
    model.make_train_function(force=True)
    return model.train_function


dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(len(x))
iterator = iter(strategy.experimental_distribute_dataset(dataset))
mlp = [first_call_minus_steady(make_mlp_step, lambda f: f(x, y)) for _ in range(REPEATS)]
keras = [first_call_minus_steady(make_keras_train_function, lambda f: f(iterator))
         for _ in range(REPEATS)]
print(f"MLP step retrace: median {statistics.median(mlp):.3f} s over {REPEATS} "
      f"(min {min(mlp):.3f}, max {max(mlp):.3f})")
print(f"Keras train function retrace: median {statistics.median(keras):.3f} s over {REPEATS} "
      f"(min {min(keras):.3f}, max {max(keras):.3f})")
print(json.dumps({"mlp_retrace_s": round(statistics.median(mlp), 4),
                  "keras_retrace_s": round(statistics.median(keras), 4)}))
