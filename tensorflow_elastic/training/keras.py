"""Keras `model.fit` under the elastic strategy: epoch/batch state, commits, resume mid-epoch.

Works with Keras 3 (the default `tf.keras` of TensorFlow 2.21) and with the
legacy tf-keras (TF_USE_LEGACY_KERAS=1): both reach it through `tf.keras`.

The input's position is the committed `state.batch` (and `state.epoch` for an
endless input): the strategy's `experimental_distribute_dataset`, which Keras
calls, cuts the user's global batches elastically, and the callback starts
every epoch's iterator at that position, so a `fit` called again after a
re-form continues the interrupted pass: no example repeats or goes missing.
"""

from __future__ import annotations

from typing import Any, Iterable

import tensorflow as tf

from tensorflow_elastic.strategy import runtime as runtime_lib
from tensorflow_elastic.training.state import State

# The world size each model's train function was traced for (by id(model)): Keras
# bakes `num_replicas_in_sync` into the loss scaling of its traced functions.
_traced_world: dict[int, int] = {}


class ElasticCallback(tf.keras.callbacks.Callback):
    """Keeps `state.epoch` and `state.batch` current, commits every `commit_every` batches, and
    starts the training input of every epoch at the committed batch.

    A commit is also where a membership change (a node joining or leaving)
    takes effect, so `commit_every` bounds both the work a crash can lose and
    how long a newcomer waits. `steps_per_epoch` is the length of a whole
    epoch (default: the `fit` call's steps).
    """

    def __init__(self, state: State, commit_every: int = 1, first_batch: int = 0,
                 steps_per_epoch: int | None = None):
        super().__init__()
        if commit_every < 1:
            raise ValueError(f"commit_every must be >= 1, got {commit_every}")
        self.state = state
        self.commit_every = commit_every
        self.first_batch = first_batch
        self.steps_per_epoch = steps_per_epoch
        self._input = None

    def on_train_begin(self, logs: dict | None = None) -> None:
        strategy = runtime_lib.current().strategy
        if strategy is None:
            raise RuntimeError("create the ElasticMultiWorkerMirroredStrategy (and the model in "
                               "its scope) before calling fit")
        # The training input is the one the strategy distributed last: fit distributes it
        # before calling on_train_begin, its validation input later.
        self._input = getattr(strategy.extended, "latest_input", None)
        if self.steps_per_epoch is None:
            self.steps_per_epoch = self.params.get("steps")
        passes = None if self._input is None else self._input.batches_per_pass
        if passes is not None and self.steps_per_epoch not in (None, passes):
            raise ValueError(
                f"steps_per_epoch={self.steps_per_epoch} but the input has {passes} global "
                f"batches per pass: an elastic epoch is one pass over a finite input; pass "
                f"steps_per_epoch={passes} (or none), or .repeat() the input")
        _retrace_if_world_changed(self.model, strategy.num_replicas_in_sync)
        if self._input is not None:
            with strategy.scope():
                _build_compiled_containers(self.model, self._input.element_spec)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.state.epoch = epoch
        if self._input is not None:
            self._input.seek(self._position(epoch, self.first_batch))

    def _position(self, epoch: int, batch: int) -> int:
        """The input's global batch at (epoch, batch): within the pass, or the stream for an
        endless input."""
        if self._input.batches_per_pass is not None or not self.steps_per_epoch:
            return batch
        return epoch * self.steps_per_epoch + batch

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.state.batch = self.first_batch + batch + 1
        # The epoch's last batch is committed by on_epoch_end, with the epoch's end: a
        # failure during validation then redoes that batch (rolled back) and the validation,
        # rather than resuming at the end of a pass with nothing left to train.
        last = self.steps_per_epoch is not None and self.state.batch >= self.steps_per_epoch
        if self.state.batch % self.commit_every == 0 and not last:
            self.state.commit()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.epoch = epoch + 1
        self.state.batch = 0
        self.first_batch = 0
        self.state.commit()


def _build_compiled_containers(model: Any, element_spec: Any) -> None:
    """Builds tf-keras' compiled loss and metrics, which it otherwise builds at the first step.

    Every `fit` epoch starts with `reset_metrics()`, which under a multi-worker
    strategy all-reduces each metric variable it resets: a newcomer must hold
    the members' metrics before its first epoch, or its collectives pair with
    the wrong ones. (Keras 3 builds them before `fit` calls any callback.)
    """
    containers = [c for c in (getattr(model, "compiled_loss", None),
                              getattr(model, "compiled_metrics", None))
                  if c is not None and getattr(c, "built", True) is False]
    if not containers or not isinstance(element_spec, tuple) or len(element_spec) < 2:
        return

    def one_example(spec):
        if spec.shape.rank is None or None in spec.shape[1:]:
            raise ValueError(f"the input's element {spec} has an unknown shape")
        return tf.zeros([1, *spec.shape[1:]], spec.dtype)

    x, y = (tf.nest.map_structure(one_example, spec) for spec in element_spec[:2])
    y_pred = model(x, training=False)
    for container in containers:
        if type(container).__name__ == "LossesContainer":
            container.build(y_pred)
        else:
            container.build(y_pred, y)


def _retrace_if_world_changed(model: Any, world: int) -> None:
    """Retraces the model's functions when the world size differs from the one they were
    traced for (their loss scaling is 1 / world size, a constant in the trace)."""
    traced = _traced_world.get(id(model))
    _traced_world[id(model)] = world
    if traced is None or traced == world:
        return
    if getattr(model, "train_function", None) is not None:
        model.make_train_function(force=True)
    model.test_function = None
    model.predict_function = None


def fit_elastic(model: Any, state: State, dataset: Any, epochs: int,
                steps_per_epoch: int | None = None, callbacks: Iterable[Any] = (),
                commit_every: int = 1, **fit_kwargs: Any) -> None:
    """`model.fit` from where `state` says training is (epoch, batch), to the end.

    `dataset` is the batched `tf.data.Dataset` a plain `fit` would get; its
    last `batch` is the global batch. `steps_per_epoch` defaults to one pass
    over a finite input. Called again by `tensorflow_elastic.run` after a
    re-form, it first finishes the interrupted epoch from the committed batch,
    then runs the remaining ones.
    """
    if steps_per_epoch is None:
        cardinality = int(dataset.cardinality())
        if cardinality < 0:
            raise ValueError("the input is endless or of unknown size: pass steps_per_epoch")
        steps_per_epoch = cardinality
    if steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
    elastic = ElasticCallback(state, commit_every, first_batch=state.batch,
                              steps_per_epoch=steps_per_epoch)
    callbacks = [elastic, *callbacks]
    if 0 < state.batch < steps_per_epoch and state.epoch < epochs:
        model.fit(dataset, initial_epoch=state.epoch, epochs=state.epoch + 1,
                  steps_per_epoch=steps_per_epoch - state.batch, callbacks=callbacks, **fit_kwargs)
    if state.epoch < epochs:
        model.fit(dataset, initial_epoch=state.epoch, epochs=epochs,
                  steps_per_epoch=steps_per_epoch, callbacks=callbacks, **fit_kwargs)
