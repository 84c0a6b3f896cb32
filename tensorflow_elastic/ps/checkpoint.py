"""The PS's checkpoints: model and optimizer variables plus the master's counters.

A checkpoint is the TensorFlow checkpoint of the variables and optimizer
(numbered by the parameter version) and ``master-<version>.npz`` beside it
with the master's state. The npz is written first, so the TensorFlow index
file, written last, commits both. The npz is fsynced before it is renamed into
place and the directory after, so a power loss cannot leave a committed
checkpoint whose master state is empty or missing. A corrupt newest checkpoint falls back to
the one before it; a checkpoint of a different model is an error.
"""

from __future__ import annotations

import json
import logging
import os
import zipfile
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

logger = logging.getLogger(__name__)

_STATE_KEY = "__state_json__"
_ARRAYS = "__arrays__"


class CheckpointError(RuntimeError):
    """No checkpoint in the directory can be restored into this model."""


class _Unreadable(Exception):
    """A checkpoint's files are missing or damaged."""


def _split(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """JSON-able part and arrays of a master state (arrays, or lists of arrays, at the top level)."""
    plain: dict[str, Any] = {}
    arrays: dict[str, np.ndarray] = {}
    for key, value in state.items():
        if isinstance(value, np.ndarray):
            arrays[key] = value
            plain[key] = {_ARRAYS: None}
        elif (isinstance(value, (list, tuple)) and value
              and all(isinstance(x, np.ndarray) for x in value)):
            arrays.update({f"{key}/{i}": x for i, x in enumerate(value)})
            plain[key] = {_ARRAYS: len(value)}
        else:
            plain[key] = value
    return plain, arrays


def _join(plain: dict[str, Any], arrays: Any) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for key, value in plain.items():
        if isinstance(value, dict) and set(value) == {_ARRAYS}:
            count = value[_ARRAYS]
            state[key] = (arrays[key] if count is None
                          else [arrays[f"{key}/{i}"] for i in range(count)])
        else:
            state[key] = value
    return state


def _fsync_directory(directory: str) -> None:
    """Makes the renames in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Checkpointer:
    """Saves and restores the PS every N updates into one directory."""

    def __init__(self, directory: str, variables: Sequence[Any], optimizer: Any,
                 max_to_keep: int = 2):
        self.directory = directory
        self._checkpoint = tf.train.Checkpoint(variables=list(variables), optimizer=optimizer)
        self._manager = tf.train.CheckpointManager(self._checkpoint, directory,
                                                   max_to_keep=max_to_keep, checkpoint_name="ps")

    def _master_path(self, version: int) -> str:
        return os.path.join(self.directory, f"master-{version}.npz")

    def save(self, version: int, master_state: dict[str, Any]) -> str:
        os.makedirs(self.directory, exist_ok=True)
        plain, arrays = _split(master_state)
        path = self._master_path(version)
        partial = path + ".partial.npz"
        with open(partial, "wb") as f:
            np.savez(f, **{_STATE_KEY: np.array(json.dumps(plain))}, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
        _fsync_directory(self.directory)
        saved = self._manager.save(checkpoint_number=version)
        self._remove_unreferenced()
        return saved

    def _remove_unreferenced(self) -> None:
        kept = {self._master_path(int(p.rsplit("-", 1)[1])) for p in self._manager.checkpoints}
        for name in os.listdir(self.directory):
            path = os.path.join(self.directory, name)
            if name.startswith("master-") and path not in kept:
                os.remove(path)

    def _load_master_state(self, version: int) -> dict[str, Any]:
        try:
            with np.load(self._master_path(version), allow_pickle=False) as npz:
                plain = json.loads(str(npz[_STATE_KEY]))
                return _join(plain, {k: npz[k] for k in npz.files if k != _STATE_KEY})
        except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile) as e:
            raise _Unreadable(f"master state of version {version}: {type(e).__name__}: {e}") from None

    def restore(self) -> tuple[int, dict[str, Any]] | None:
        """(version, master state) of the newest readable checkpoint; None when there is none."""
        candidates = list(reversed(self._manager.checkpoints))
        if not candidates:
            return None
        failures = []
        for prefix in candidates:
            version = int(prefix.rsplit("-", 1)[1])
            try:
                state = self._load_master_state(version)
                self._checkpoint.restore(prefix).assert_existing_objects_matched()
            except (ValueError, AssertionError, tf.errors.InvalidArgumentError) as e:
                raise CheckpointError(
                    f"checkpoint {prefix} does not fit this model ({str(e).splitlines()[0]}); "
                    f"use a new --checkpoint_dir for a different model") from None
            except (tf.errors.OpError, _Unreadable) as e:
                failures.append(f"{prefix}: {str(e).splitlines()[0]}")
                logger.warning("checkpoint %s is unreadable (%s); trying an older one", prefix, e)
                continue
            return version, state
        raise CheckpointError(f"no readable checkpoint in {self.directory}: "
                              + "; ".join(failures)
                              + "; remove the directory to start from scratch")
