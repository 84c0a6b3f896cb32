"""Keras `model.fit` under the elastic strategy: epoch/batch state, commits, resume mid-epoch.

Works with Keras 3 (the default `tf.keras` of TensorFlow 2.21) and with the
legacy tf-keras (TF_USE_LEGACY_KERAS=1): both reach it through `tf.keras`.
"""

from __future__ import annotations

from typing import Any, Iterable

import tensorflow as tf

from tensorflow_elastic.training.state import State


class ElasticCallback(tf.keras.callbacks.Callback):
    """Keeps `state.epoch` and `state.batch` current and commits every `commit_every` batches.

    A commit is also where a membership change (a node joining or leaving)
    takes effect, so `commit_every` bounds both the work a crash can lose and
    how long a newcomer waits.
    """

    def __init__(self, state: State, commit_every: int = 1, first_batch: int = 0):
        super().__init__()
        if commit_every < 1:
            raise ValueError(f"commit_every must be >= 1, got {commit_every}")
        self.state = state
        self.commit_every = commit_every
        self.first_batch = first_batch

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.state.epoch = epoch

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.state.batch = self.first_batch + batch + 1
        if self.state.batch % self.commit_every == 0:
            self.state.commit()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.epoch = epoch + 1
        self.state.batch = 0
        self.first_batch = 0
        self.state.commit()


def fit_elastic(model: Any, state: State, dataset: Any, epochs: int, steps_per_epoch: int,
                callbacks: Iterable[Any] = (), commit_every: int = 1, **fit_kwargs: Any) -> None:
    """`model.fit` from where `state` says training is (epoch, batch), to the end.

    Called again by `tensorflow_elastic.run` after a re-form, it first finishes
    the interrupted epoch, then runs the remaining ones; Keras' traced train
    function is reused across calls and membership changes.
    """
    if steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
    elastic = ElasticCallback(state, commit_every, first_batch=state.batch)
    callbacks = [elastic, *callbacks]
    if 0 < state.batch < steps_per_epoch and state.epoch < epochs:
        model.fit(dataset, initial_epoch=state.epoch, epochs=state.epoch + 1,
                  steps_per_epoch=steps_per_epoch - state.batch, callbacks=callbacks, **fit_kwargs)
    if state.epoch < epochs:
        model.fit(dataset, initial_epoch=state.epoch, epochs=epochs,
                  steps_per_epoch=steps_per_epoch, callbacks=callbacks, **fit_kwargs)
