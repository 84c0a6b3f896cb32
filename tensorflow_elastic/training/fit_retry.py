"""A Keras 3 `fit` call goes on after its generation ended: the batch in flight runs again, or
the next one runs, inside the same call.

A failed batch's train function, wrapped for the batch, hands the error to the elastic
callback, which recovers as `tfe.run` does (back to the last commit, re-form, sync); a change
voted at a commit (a node joins or leaves) is taken at the next batch's start the same way.
Leaving `fit` and entering it again would make a new input iterator, build and reset the
metrics: most of a Keras recovery's time. Pure decisions say when going on is safe, and what
a member does first when another one (a newcomer) begins its `fit` call; the wrapper does it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import tensorflow as tf


def retries_in_fit(keras_3: bool, one_trace_for_every_world: bool, in_elastic_run: bool,
                   commit_every: int, snapshot_every: int) -> bool:
    """Whether a `fit` call can go on after a recovery.

    It needs a train function that serves every world size (Keras 3 scaling its losses at
    run time; tf-keras traces one per size, in the next `fit`), the elastic loop around
    `fit` (it re-forms), and a snapshot at every batch: then every member's last commit is
    where its batch in flight started, and members at the same commit run the same batch.
    """
    return (keras_3 and one_trace_for_every_world and in_elastic_run and commit_every == 1
            and snapshot_every == 1)


@dataclasses.dataclass(frozen=True)
class GoOn:
    """The `fit` call goes on from where it was. `with_new_fits`: some members begin a `fit`
    call now (newcomers; members whose failure struck outside their `fit`), and Keras 3
    begins one with a reset of the metrics: this member resets its metrics too, so that
    every worker counts from the same batch (where that reset reads each metric back across
    the workers, so that the generation's collectives pair too: under the elastic strategy
    Keras 3's does not, see keras.py). (With several devices a worker a beginning call also
    reduces the first batch across the workers, before its callbacks begin: see
    after_recovery.)"""

    with_new_fits: bool


def after_recovery(beginning_fit: frozenset[int], synced: frozenset[int],
                   position: tuple[int, int], synced_to: tuple[int, int],
                   one_device_each: bool) -> GoOn | str:
    """After a recovery inside `fit`: how the call goes on from `position` (epoch, batch: the
    batch that runs next), or why it cannot (every member then enters `fit` again).

    `beginning_fit` are the members that did not recover inside their `fit`, `synced` the
    ones the sync gave another member's state, `one_device_each` whether every member drives
    one device: facts every member shares, so that the members in their `fit` decide alike.
    A member in its `fit` that was synced was at another commit than the others (one of
    them finished the failed batch: the batch in flight differs between them); a member
    that begins its `fit` call starts at the synced state, which is every other member's.
    With several devices a worker, a `fit` call reduces its first batch across the workers
    before it begins its callbacks (Keras 3's symbolic build): every member begins one then.
    """
    if synced - beginning_fit:
        return "the members were at different commits"
    if beginning_fit and not one_device_each:
        return (f"member(s) {sorted(beginning_fit)} begin a fit call, whose first batch is "
                f"reduced across the workers (several devices a worker)")
    if synced_to != position:
        return (f"the state is at epoch {synced_to[0]}, batch {synced_to[1]}, not where the "
                f"batch in flight started (epoch {position[0]}, batch {position[1]})")
    return GoOn(with_new_fits=bool(beginning_fit))


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
