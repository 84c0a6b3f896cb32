"""A worker of the exactly-once Keras tests: `fit_elastic` over a batched tf.data input.

`tf.keras` is Keras 3, or tf-keras when TF_USE_LEGACY_KERAS=1. Every example
carries its id; a non-trainable weight counts, across all workers, how many
times each id was trained on (only_first_replica + an explicit all-reduce,
the way that counts correctly under a strategy).

The input is shuffled (`.shuffle` before the batch: the elastic input makes
it a per-epoch order every member shares). With KERAS_FIT_TFRECORD=direct or
interleave the examples are read from the TFRecord files in
KERAS_FIT_TFRECORD_DIR (each holding the ids of its examples). A CSVLogger, a ModelCheckpoint and
a TensorBoard write into KERAS_FIT_OUT (they must run on the current chief only). With
KERAS_FIT_PLAIN=1 the worker calls a plain `model.fit` with the elastic
callback (and wraps the file writers itself) instead of `fit_elastic`.
KERAS_FIT_DIE_IN_SYNC=1 makes a newcomer SIGKILL itself in its state sync,
when the members are about to send it their variables; with
KERAS_FIT_BAD_SYNC=1 a newcomer receives its first variable with a shape other
than the members send (a state that differs past the layout check): its
transfer fails with a mismatch (InvalidArgumentError or InternalError). KERAS_FIT_BACKUP=1: the
chief writes the state to KERAS_FIT_OUT at every epoch's end, and a worker
starting reads it from there first (a job restarted as a whole resumes).
The learning rate decays with the optimizer's iterations (the global step). After
training, every worker also runs `evaluate` and `predict` under the strategy.

argv: epochs, examples, global batch, sleep per batch (s). With
KERAS_FIT_REFERENCE=1 it trains the same model in one plain process, no
strategy, over the same global batches (the result to compare with).
A newcomer warms up (`tfe.keras.warm_up`) before it joins.
Prints a JSON line per batch and a final {"done": ...} line (with the generations its train
step was traced in).
"""

import json
import os
import signal
import sys
import time

import numpy as np
import tensorflow as tf

EPOCHS, EXAMPLES, GLOBAL_BATCH = (int(a) for a in sys.argv[1:4])
BATCH_SLEEP_S = float(sys.argv[4])
# A file: while it exists, every batch waits (the test's newcomers start meanwhile).
HOLD = os.environ.get("KERAS_FIT_HOLD")
REFERENCE = os.environ.get("KERAS_FIT_REFERENCE") == "1"
# A misconfigured node: one weight more than the members (its sync must fail on its side only).
EXTRA_WEIGHT = os.environ.get("KERAS_FIT_EXTRA_WEIGHT") == "1"
PLAIN_FIT = os.environ.get("KERAS_FIT_PLAIN") == "1"
OUT = os.environ.get("KERAS_FIT_OUT", ".")
CSV_PATH = os.path.join(OUT, "log.csv")
CHECKPOINT_PATH = os.path.join(OUT, "model.weights.h5")
BACKUP = os.path.join(OUT, "state.npz") if os.environ.get("KERAS_FIT_BACKUP") == "1" else None

if not REFERENCE:
    import tensorflow_elastic as tfe

    runtime = tfe.init()
    strategy = tfe.ElasticMultiWorkerMirroredStrategy()
else:
    strategy = tf.distribute.get_strategy()

keras = tf.keras
LEGACY = os.environ.get("TF_USE_LEGACY_KERAS") == "1"


def make_example(i):
    x = tf.cast(i, tf.float32)
    features = tf.stack([x, tf.sin(x), tf.cos(x * 0.7), tf.sin(x * 1.3), tf.cos(x * 0.1)])
    return features, tf.sin(x * 0.5)


# The generations the train step was traced in (0: before joining, in a newcomer's warm-up).
TRACED_IN = []


class CountingModel(keras.Model):
    """Dense regression on features[1:]; `counts[i]` = how often example i was trained on."""

    def __init__(self):
        inputs = keras.Input((5,))
        hidden = keras.layers.Dense(8, activation="tanh")(inputs[:, 1:] if not LEGACY else
                                                          keras.layers.Lambda(
                                                              lambda t: t[:, 1:])(inputs))
        super().__init__(inputs=inputs, outputs=keras.layers.Dense(1)(hidden))
        aggregation = (tf.VariableAggregation.ONLY_FIRST_REPLICA if LEGACY
                       else "only_first_replica")
        self.counts = self.add_weight(name="counts", shape=(EXAMPLES,), initializer="zeros",
                                      trainable=False, aggregation=aggregation)
        if EXTRA_WEIGHT:
            self.extra = self.add_weight(name="extra", shape=(3,), initializer="zeros",
                                         trainable=False)

    def train_step(self, data):
        if not REFERENCE:
            TRACED_IN.append(runtime.generation)  # Python: runs when Keras traces the step
        x, _ = data
        ids = tf.cast(x[:, 0], tf.int32)
        seen = tf.reduce_sum(tf.one_hot(ids, EXAMPLES), axis=0)
        self.counts.assign_add(tf.distribute.get_replica_context().all_reduce("SUM", seen))
        return super().train_step(data)


def tfrecord_examples(form):
    """The examples from the TFRecord files in KERAS_FIT_TFRECORD_DIR (example i has feature
    "id" = i), as users read them: `direct` or through an `interleave` of the file list."""
    files = sorted(tf.io.gfile.glob(os.path.join(os.environ["KERAS_FIT_TFRECORD_DIR"], "*")))
    records = (tf.data.TFRecordDataset(files) if form == "direct" else
               tf.data.Dataset.from_tensor_slices(files).interleave(
                   tf.data.TFRecordDataset, cycle_length=4, deterministic=True))
    return records.map(lambda record: make_example(tf.io.parse_single_example(
        record, {"id": tf.io.FixedLenFeature([], tf.int64)})["id"]))


TFRECORD = os.environ.get("KERAS_FIT_TFRECORD")
examples = (tfrecord_examples(TFRECORD) if TFRECORD else
            tf.data.Dataset.range(EXAMPLES).map(make_example))
dataset = examples.shuffle(EXAMPLES, seed=5).batch(GLOBAL_BATCH)
# Validation examples after the training ones, 4 global batches.
validation = tf.data.Dataset.range(EXAMPLES, EXAMPLES + 4 * GLOBAL_BATCH).map(
    make_example).batch(GLOBAL_BATCH)
rng = np.random.RandomState(0)
with strategy.scope():
    model = CountingModel()
    model.set_weights([rng.uniform(-0.5, 0.5, w.shape).astype(np.float32)
                       if w.shape not in ((EXAMPLES,), (3,)) else np.zeros(w.shape, np.float32)
                       for w in model.get_weights()])
    model.compile(keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(
        0.05, decay_steps=EXAMPLES // GLOBAL_BATCH, decay_rate=0.5)), "mse")


def trained_weights(of=None):
    return [float(x) for w in (of or model).trainable_weights for x in np.reshape(w.numpy(), -1)]


class LastValidation(keras.callbacks.Callback):
    """The validation loss of the last epoch (every member's, aggregated over all of them)."""

    loss = None

    def on_epoch_end(self, epoch, logs=None):
        LastValidation.loss = float(logs["val_loss"])


csv_logger = keras.callbacks.CSVLogger(CSV_PATH)
checkpoint = keras.callbacks.ModelCheckpoint(CHECKPOINT_PATH, save_weights_only=True)
tensorboard = keras.callbacks.TensorBoard(os.path.join(OUT, "tensorboard"))


def evaluate_and_predict():
    """`evaluate` and `predict` over the validation set (under the strategy every member takes
    part, inside the elastic run: its members leave when it is over)."""
    return model.evaluate(validation, verbose=0), model.predict(validation, verbose=0)


def report_done(evaluated, predicted):
    result = {"done": True, "node": None if REFERENCE else runtime.node_id,
              "weights": trained_weights(), "val_loss": LastValidation.loss,
              "evaluated": float(evaluated), "iterations": int(model.optimizer.iterations.numpy()),
              "predicted": [float(x) for x in np.reshape(predicted, -1)],
              # How many examples were trained on how many times: {"3": 480} is exactly once.
              "counts": {str(int(c)): int(n) for c, n in zip(*np.unique(model.counts.numpy(),
                                                                    return_counts=True))},
              "wrote_csv": getattr(csv_logger, "csv_file", None) is not None,
              "traced_in": TRACED_IN}
    if not REFERENCE and runtime.node_id == runtime.membership.chief_id:
        # A plain copy, outside the strategy, holds what the last checkpoint holds.
        copy = CountingModel()
        copy.load_weights(CHECKPOINT_PATH)
        result["checkpoint_weights"] = trained_weights(copy)
    line = (json.dumps(result) + "\n").encode()
    # One write of less than a pipe's atomic size: TensorFlow's threads write to the same pipe.
    assert len(line) < 4096, len(line)
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), line)
    os._exit(0)


if REFERENCE:
    from tensorflow_elastic.data.addressable import addressable
    from tensorflow_elastic.data.shuffle import split_shuffle

    # The order the elastic input gives each epoch, one epoch at a time.
    _, shuffle = split_shuffle(dataset._input_dataset)
    examples = addressable(examples, shuffled=True)
    for epoch in range(EPOCHS):
        model.fit(shuffle.order(examples, epoch).batch(GLOBAL_BATCH), initial_epoch=epoch,
                  epochs=epoch + 1, verbose=0, validation_data=validation,
                  callbacks=[LastValidation()])
    report_done(*evaluate_and_predict())

if os.environ.get("KERAS_FIT_DIE_IN_SYNC") == "1":
    def die(variables, source, receivers, **options):
        os.kill(os.getpid(), signal.SIGKILL)

    strategy.extended.broadcast_variables = die

if os.environ.get("KERAS_FIT_BAD_SYNC") == "1":
    broadcast = strategy.extended.broadcast_variables
    with tf.device("/cpu:0"):
        misshapen = tf.Variable(tf.zeros([7]))

    def broadcast_misshapen(variables, source, receivers, **options):
        broadcast([misshapen, *variables[1:]], source, receivers, **options)

    strategy.extended.broadcast_variables = broadcast_misshapen

state = tfe.KerasState(model, model.optimizer, epoch=0, batch=0)
# Global batches per pass (stock tf.data cannot count TFRecord files).
steps_per_epoch = -(-EXAMPLES // GLOBAL_BATCH)


class Report(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        print(json.dumps({"node": runtime.node_id, "epoch": state.epoch, "batch": state.batch,
                          "step": state.epoch * steps_per_epoch + state.batch,
                          "world": runtime.membership.world_size,
                          "generation": runtime.generation}), flush=True)
        time.sleep(BATCH_SLEEP_S)
        # The test holds the job (at most a minute) until its newcomers wait to join.
        held_until = time.monotonic() + 60
        while HOLD and os.path.exists(HOLD) and time.monotonic() < held_until:
            time.sleep(0.05)


@tfe.run
def train(state):
    if PLAIN_FIT:
        model.fit(dataset, epochs=EPOCHS, verbose=0, validation_data=validation,
                  callbacks=[tfe.keras.ElasticCallback(state, backup=BACKUP), Report(),
                             LastValidation(),
                             tfe.keras.ChiefOnly(csv_logger, state),
                             tfe.keras.ChiefOnly(checkpoint, state),
                             tfe.keras.ChiefOnly(tensorboard, state)])
    else:
        tfe.keras.fit_elastic(model, state, dataset, epochs=EPOCHS, verbose=0,
                              validation_data=validation, backup=BACKUP,
                              callbacks=[Report(), LastValidation(), csv_logger, checkpoint,
                                         tensorboard])
    return evaluate_and_predict()


if BACKUP is not None:
    state.read(BACKUP)
# A newcomer runs a step of fit alone before it joins (the sync replaces what it changed).
tfe.keras.warm_up(model, dataset)
report_done(*train(state))
