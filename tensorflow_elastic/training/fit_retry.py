"""A Keras 3 batch whose generation ended runs again inside the same `fit` call.

Its train function, wrapped for the batch, hands the error to the elastic
callback, which recovers as `tfe.run` does (back to the last commit, re-form,
sync); the batch then runs again in place. Leaving `fit` and entering it again
would make a new input iterator, build and reset the metrics: most of a Keras
recovery's time. Two pure decisions say when that is safe; the wrapper does it.
"""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf


def retries_in_fit(keras_3: bool, one_trace_for_every_world: bool, in_elastic_run: bool,
                   commit_every: int, snapshot_every: int) -> bool:
    """Whether a failed batch can run again inside its `fit` call.

    It needs a train function that serves every world size (Keras 3 scaling its losses at
    run time; tf-keras traces one per size, in the next `fit`), the elastic loop around
    `fit` (it re-forms), and a snapshot at every batch: then every member's last commit is
    where its batch in flight started, and members at the same commit run the same batch.
    """
    return (keras_3 and one_trace_for_every_world and in_elastic_run and commit_every == 1
            and snapshot_every == 1)


def why_fit_starts_again(every_member_in_fit: bool, last_sync_even: bool,
                         batch_start: tuple[int, int], synced_to: tuple[int, int]) -> str | None:
    """After a recovery inside `fit`: why the failed batch cannot run again in place (every
    member then enters `fit` again), or None.

    The members decide alike from what the sync told them all. A member that did not recover
    inside its `fit` (a newcomer, one whose failure struck outside a batch, as in the sync
    that admits a newcomer) begins a `fit` call next, and Keras 3 begins one with collectives
    of its own (the metrics' reset reads each one back across the workers; with several
    devices a worker the first batch is reduced): every member must begin one with it. An
    uneven sync means members at different commits (one of them finished the failed batch:
    the batch in flight differs between them).
    """
    if not every_member_in_fit:
        return "a member (a newcomer, or one that failed outside a batch) begins its fit now"
    if not last_sync_even:
        return "the members were at different commits"
    if synced_to != batch_start:
        return (f"the state is at epoch {synced_to[0]}, batch {synced_to[1]}, not where the batch "
                f"in flight started (epoch {batch_start[0]}, batch {batch_start[1]})")
    return None


class BatchRetry:
    """The model's train function for one batch: a failure goes to `recover`, which returns
    when the batch can run again, else raises. It puts the plain function back on the model
    as soon as it returns or raises, so a `fit` that ends in an error leaves the plain one
    (unless a callback after the elastic one failed the batch's beginning, before the train
    function ran: the next batch's wrapper then wraps the plain one)."""

    def __init__(self, model: Any, recover: Callable[[Exception], None]):
        self.model = model
        function = model.train_function
        # One a callback's error before the train function ran left on the model.
        self.function = function.function if isinstance(function, BatchRetry) else function
        self.recover = recover
        model.train_function = self

    def __call__(self, iterator: Any) -> Any:
        try:
            while True:
                try:
                    return self.function(iterator)
                except tf.errors.OutOfRangeError:
                    raise  # the end of the input: Keras ends the epoch
                except Exception as error:  # noqa: BLE001 - the elastic loop's decision sorts it
                    self.recover(error)
        finally:
            if self.model.train_function is self:
                self.model.train_function = self.function
