"""Membership changes and recoveries as TensorBoard scalars, beside the model's own curves.

A loss curve that bends at step 1200 is explained when the world size fell
from 4 to 3 there. The current chief writes (a run named ``elastic`` under the
log directory), once per change, at the job's global step.
"""

from __future__ import annotations

import os
from typing import Any

import tensorflow as tf

from tensorflow_elastic.membership.node_file import Progress
from tensorflow_elastic.strategy import runtime as runtime_lib
from tensorflow_elastic.training.state import State

RUN_NAME = "elastic"


def membership_scalars(world_size: int, generation: int, progress: Progress) -> dict[str, float]:
    """The scalars written at a change: the job's size and generation, this node's recoveries."""
    scalars = {"elastic/world_size": world_size, "elastic/generation": generation,
               "elastic/recoveries": progress.recoveries, "elastic/lost_steps": progress.lost_steps}
    if progress.recovery_seconds:
        scalars["elastic/recovery_seconds"] = progress.recovery_seconds[-1]
    return scalars


class MembershipSummaries(tf.keras.callbacks.Callback):
    """Writes membership changes and recoveries to ``log_dir/elastic`` (give it the
    TensorBoard callback's log_dir), on the chief, at ``state``'s commit count."""

    def __init__(self, log_dir: str, state: State):
        super().__init__()
        self.log_dir = os.path.join(log_dir, RUN_NAME)
        self._state = state
        self._writer: Any = None
        self._written: tuple[int, int] | None = None  # (generation, recoveries) last seen

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.write_if_changed()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.write_if_changed()

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._writer is not None:
            self._writer.flush()

    def write_if_changed(self) -> None:
        """Writes the scalars when the generation or the recoveries changed since the last call
        (a custom loop calls it after its commits)."""
        runtime = runtime_lib.current_or_none()
        if runtime is None or runtime.membership is None:
            return
        progress = runtime.session.progress
        seen = (runtime.generation, progress.recoveries)
        if seen == self._written:
            return
        self._written = seen
        if runtime.node_id != runtime.membership.chief_id:
            return
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)
        with self._writer.as_default():
            for name, value in membership_scalars(runtime.membership.world_size,
                                                  runtime.generation, progress).items():
                tf.summary.scalar(name, value, step=self._state.commits)
        self._writer.flush()
