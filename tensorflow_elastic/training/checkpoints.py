"""A State's backup on any filesystem TensorFlow reaches, in TensorFlow's own checkpoint format.

A backup at PATH is a directory as ``tf.train.CheckpointManager`` keeps one:
checkpoints ``ckpt-<commits>-<unique>`` (``.index`` and ``.data-*``, written by
``tf.train.Checkpoint``) and the ``checkpoint`` file naming the latest, so stock
TensorFlow loads it::

    tf.train.Checkpoint(variables=model.variables + optimizer.variables).read(
        tf.train.latest_checkpoint(PATH)).expect_partial()

Every file goes through ``tf.io.gfile`` (local paths, ``gs://``, ``s3://``,
``hdfs://``, ``ram://``). A new checkpoint is written under a name no other
writer uses, and only then does the ``checkpoint`` file (rewritten under a
unique temporary name and renamed over the old one) point to it: a reader sees
the old checkpoint or the new one, never half of one. On a local disk the files
and the directory are synced. Checkpoints beyond the ``keep`` latest are
deleted once the new one is in place.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import socket
from typing import Any

import numpy as np
import tensorflow as tf

POINTER = "checkpoint"  # the file tf.train.latest_checkpoint reads
META = "meta"  # the checkpoint's JSON string: layout, Python values, commits
_POINTER_LINE = re.compile(r'^(model_checkpoint_path|all_model_checkpoint_paths): "([^"]*)"$')
_NAME = re.compile(r"^ckpt-(\d+)-[0-9a-f]+$")


@dataclasses.dataclass(frozen=True)
class Saved:
    """What a backup holds: the variables' layout and values, Python values, commit count."""

    layout: list
    values: dict[str, Any]
    commits: int
    arrays: list[np.ndarray]


class _Value(tf.__internal__.tracking.Trackable):
    """A value saved under the key a tf.Variable's value has, so that stock TensorFlow restores
    it into a variable; none is created here (in a strategy's scope, where Keras runs its
    callbacks, a new variable would be a mirrored one whose creation waits for every member)."""

    def __init__(self, value: Any):
        self._value = tf.constant(value)

    def _serialize_to_tensors(self) -> dict[str, tf.Tensor]:
        return {"VARIABLE_VALUE": self._value}


def _latest_names(path: str) -> list[str]:
    """The checkpoints the pointer lists, oldest first, latest last (none: no valid pointer)."""
    try:
        with tf.io.gfile.GFile(os.path.join(path, POINTER)) as f:
            text = f.read()
    except (tf.errors.OpError, UnicodeDecodeError):
        return []
    latest, listed = None, []
    for line in text.splitlines():
        match = _POINTER_LINE.match(line.strip())
        if match is None or not _NAME.match(match.group(2)):
            return []
        if match.group(1) == "model_checkpoint_path":
            latest = match.group(2)
        else:
            listed.append(match.group(2))
    if latest is None:
        return []
    return [name for name in listed if name != latest] + [latest]


def saved_commits(path: str) -> int:
    """The commit the latest checkpoint at ``path`` holds (-1: none, or no valid pointer)."""
    names = _latest_names(path)
    return int(_NAME.match(names[-1]).group(1)) if names else -1


def write(path: str, saved: Saved, keep: int = 1) -> bool:
    """Writes ``saved`` as the latest checkpoint at ``path``, unless one of a later commit is
    there already (a member that fell behind must not take the job back); returns whether it
    wrote."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    before = _latest_names(path)
    if before and int(_NAME.match(before[-1]).group(1)) > saved.commits:
        return False
    tf.io.gfile.makedirs(path)
    name = f"ckpt-{saved.commits}-{secrets.token_hex(6)}"
    meta = json.dumps({"layout": saved.layout, "values": saved.values,
                       "commits": saved.commits})
    with tf.device("/cpu:0"):
        checkpoint = tf.train.Checkpoint(variables=[_Value(array) for array in saved.arrays],
                                         **{META: _Value(meta)})
    checkpoint.write(os.path.join(path, name))
    _sync_local(tf.io.gfile.glob(os.path.join(path, name) + ".*"))
    kept = before[-(keep - 1):] if keep > 1 else []
    _replace_pointer(path, kept + [name])
    for old in set(before) - set(kept):
        for file in tf.io.gfile.glob(os.path.join(path, old) + ".*"):
            tf.io.gfile.remove(file)
    return True


def read(path: str) -> Saved | None:
    """The latest checkpoint at ``path``, or None when there is none."""
    names = _latest_names(path)
    if not names:
        return None
    # load_checkpoint would take a prefix on ram:// for a directory; the reader takes it as is.
    reader = tf.compat.v1.train.NewCheckpointReader(os.path.join(path, names[-1]))
    meta = json.loads(_value(reader, META).decode())
    arrays = [_value(reader, f"variables/{i}") for i in range(len(meta["layout"]))]
    return Saved(meta["layout"], meta["values"], meta["commits"], arrays)


def _value(reader: Any, name: str) -> Any:
    return reader.get_tensor(f"{name}/.ATTRIBUTES/VARIABLE_VALUE")


def _replace_pointer(path: str, names: list[str]) -> None:
    """Points tf.train.latest_checkpoint at ``names[-1]`` (keeping ``names``) in one rename."""
    lines = [f'model_checkpoint_path: "{names[-1]}"']
    lines += [f'all_model_checkpoint_paths: "{name}"' for name in names]
    pointer = os.path.join(path, POINTER)
    temporary = f"{pointer}.{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        with tf.io.gfile.GFile(temporary, "w") as f:
            f.write("\n".join(lines) + "\n")
        _sync_local([temporary])
        tf.io.gfile.rename(temporary, pointer, overwrite=True)
    except BaseException:
        if tf.io.gfile.exists(temporary):
            tf.io.gfile.remove(temporary)
        raise
    _sync_local([path])


def _sync_local(paths: list[str]) -> None:
    """fsync for files and directories on a local disk (other filesystems have no such call)."""
    for path in paths:
        if "://" in path:
            continue
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
