"""A worker that drives several local replicas: logical CPU devices, one replica each.

LOCAL_DEVICES (default 2) logical CPUs; MODE=loop (a custom loop over
`distribute_elastic_dataset`) or keras (`fit_elastic` over a batched tf.data
input). Linear regression on element ids (features computed from the id); every
example's id is counted, summed across all replicas, in a non-trainable
variable that the state commits and restores with the weights.

argv: elements, global batch, sleep per step (s). Every step prints
{"node", "generation", "step", "world", "replicas"} once committed; the loop
prints {"node", "generation", "batch", "ids"} before each step (the ids of its
replicas' slices, before a kill can come between the step and a later line);
the end prints {"done",
"weights", "copies", "counts"}, "copies" being every local copy of every
variable (what each replica holds). With REFERENCE=1 it trains the same
global batches in one plain process (no strategy) and prints the done line.
"""

import json
import os
import sys
import time

import tensorflow as tf

ELEMENTS, GLOBAL_BATCH = int(sys.argv[1]), int(sys.argv[2])
STEP_SLEEP_S = float(sys.argv[3])
STEPS = ELEMENTS // GLOBAL_BATCH
LOCAL_DEVICES = int(os.environ.get("LOCAL_DEVICES", "2"))
MODE = os.environ.get("MODE", "loop")
REFERENCE = os.environ.get("REFERENCE") == "1"
LEARNING_RATE = 0.1
TRUE_WEIGHTS = [0.5, -1.0, 2.0, 0.25]

if REFERENCE:
    strategy = tf.distribute.get_strategy()
else:
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration()] * LOCAL_DEVICES)
    import tensorflow_elastic as tfe

    runtime = tfe.init()
    strategy = tfe.ElasticMultiWorkerMirroredStrategy(
        devices=[f"CPU:{i}" for i in range(LOCAL_DEVICES)])


def features(ids):
    i = tf.cast(ids, tf.float32)
    return tf.stack([tf.sin(i), tf.cos(i), tf.math.floormod(i, 7.0) / 7.0, tf.ones_like(i)], axis=1)


def targets(ids):
    return tf.linalg.matvec(features(ids), tf.constant(TRUE_WEIGHTS))


def seen(ids):
    """How often each id is in `ids`, summed across every replica of the job."""
    counts = tf.math.unsorted_segment_sum(tf.ones_like(ids, tf.float32), ids, ELEMENTS)
    return tf.distribute.get_replica_context().all_reduce("SUM", counts)


class Regression(tf.keras.Model):
    """w . features(id), trained on (id, target) pairs; counts the ids it trains on."""

    def __init__(self):
        super().__init__()
        self.w = self.add_weight(shape=(4,), initializer="zeros", name="w")
        self.counts = self.add_weight(shape=(ELEMENTS,), initializer="zeros", trainable=False,
                                      aggregation="only_first_replica", name="counts")

    def call(self, ids):
        return tf.linalg.matvec(features(ids), self.w.value)[:, None]

    def train_step(self, data):
        ids, _ = data
        self.counts.assign_add(seen(tf.cast(ids, tf.int64)))
        return super().train_step(data)


def examples():
    return tf.data.Dataset.range(ELEMENTS).map(lambda i: (i, targets(i[None])))


with strategy.scope():
    if MODE == "keras":
        model = Regression()
        model.compile(tf.keras.optimizers.SGD(LEARNING_RATE), "mse")
        model(tf.zeros([1], tf.int64))
        variables = [model.w, model.counts]
    else:
        weights = tf.Variable(tf.zeros([4]))
        counts = tf.Variable(tf.zeros([ELEMENTS]))
        variables = [weights, counts]


@tf.function
def train_step(ids):
    def replica_step(ids):
        x, y = features(ids), targets(ids)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(tf.linalg.matvec(x, weights) - y)) / GLOBAL_BATCH
        grad = tf.distribute.get_replica_context().all_reduce("SUM", tape.gradient(loss, weights))
        weights.assign_sub(LEARNING_RATE * grad)
        counts.assign_add(seen(ids))

    strategy.run(replica_step, args=(ids,))


def local_copies(variable):
    inner = getattr(variable, "_value", variable)
    values = getattr(inner, "values", None)
    return [v.numpy().tolist() for v in (values if values is not None else [inner])]


def report_done(node):
    print(json.dumps({"done": True, "node": node,
                      "weights": local_copies(variables[0])[0],
                      "copies": [local_copies(v) for v in variables],
                      "counts": local_copies(variables[1])[0]}), flush=True)
    sys.stdout.flush()
    os._exit(0)


if REFERENCE:
    batches = examples().batch(GLOBAL_BATCH)
    if MODE == "keras":
        model.fit(batches, epochs=1, verbose=0)
    else:
        for ids, _ in batches:
            train_step(ids)
    report_done(None)


def report_step(step):
    print(json.dumps({"node": runtime.node_id, "generation": runtime.generation, "step": step,
                      "world": runtime.membership.world_size,
                      "replicas": strategy.num_replicas_in_sync}), flush=True)
    time.sleep(STEP_SLEEP_S)


if MODE == "keras":
    state = tfe.KerasState(model, model.optimizer, epoch=0, batch=0)

    class Report(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            report_step(state.batch)

    @tfe.run
    def train(state):
        tfe.keras.fit_elastic(model, state, examples().batch(GLOBAL_BATCH), epochs=1,
                              callbacks=[Report()], verbose=0)
else:
    state = tfe.TensorFlowState(variables, step=0)
    iterator = iter(strategy.distribute_elastic_dataset(tf.data.Dataset.range(ELEMENTS),
                                                        GLOBAL_BATCH))

    @tfe.run
    def train(state):
        while state.step < STEPS:
            ids = next(iterator)
            print(json.dumps({"node": runtime.node_id, "generation": runtime.generation,
                              "batch": state.step + 1,
                              "ids": [[int(i) for i in part.numpy()]
                                      for part in strategy.experimental_local_results(ids)]}),
                  flush=True)
            train_step(ids)
            state.step += 1
            report_step(state.step)
            state.commit()

train(state)
report_done(runtime.node_id)
