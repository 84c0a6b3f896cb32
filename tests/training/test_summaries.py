"""Membership changes and recoveries as TensorBoard scalars, written by the chief once per change."""

from __future__ import annotations

import glob
import types

import tensorflow as tf

import tensorflow_elastic as tfe
from tensorflow_elastic.membership.node_file import Progress
from tensorflow_elastic.strategy import runtime as runtime_lib
from tensorflow_elastic.training import summaries


def fake_runtime(node_id: int, chief_id: int, generation: int, world_size: int,
                 progress: Progress) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        node_id=node_id, generation=generation, session=types.SimpleNamespace(progress=progress),
        membership=types.SimpleNamespace(chief_id=chief_id, world_size=world_size))


def scalars(log_dir: str) -> list[tuple[int, str, float]]:
    """(step, tag, value) of every scalar under log_dir/elastic, in order."""
    found = []
    for path in sorted(glob.glob(f"{log_dir}/elastic/events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                found.append((event.step, value.tag, float(tf.make_ndarray(value.tensor))))
    return found


def test_the_chief_writes_each_change_once_at_the_jobs_step(tmp_path, monkeypatch):
    progress = Progress()
    state = tfe.State(step=0)
    runtime = fake_runtime(node_id=1, chief_id=1, generation=1, world_size=3, progress=progress)
    monkeypatch.setattr(runtime_lib, "current_or_none", lambda: runtime)
    callback = tfe.keras.MembershipSummaries(str(tmp_path), state)
    callback.on_train_begin()
    object.__setattr__(state, "_commits", 40)
    callback.on_train_batch_end(0)  # nothing changed: nothing written
    progress.recovered(0.75, 1)
    runtime.generation, runtime.membership.world_size = 2, 2
    callback.on_train_batch_end(1)
    callback.on_train_end()
    written = scalars(str(tmp_path))
    assert [(s, t, v) for s, t, v in written if t == "elastic/world_size"] == [
        (0, "elastic/world_size", 3.0), (40, "elastic/world_size", 2.0)]
    assert (40, "elastic/recovery_seconds", 0.75) in written
    assert (40, "elastic/recoveries", 1.0) in written and (40, "elastic/lost_steps", 1.0) in written
    assert len(written) == 4 + 5


def test_a_member_that_is_not_the_chief_writes_nothing(tmp_path, monkeypatch):
    runtime = fake_runtime(node_id=2, chief_id=1, generation=1, world_size=2, progress=Progress())
    monkeypatch.setattr(runtime_lib, "current_or_none", lambda: runtime)
    callback = summaries.MembershipSummaries(str(tmp_path), tfe.State(step=0))
    callback.on_train_begin()
    callback.on_train_end()
    assert scalars(str(tmp_path)) == []
