"""Where the orchestrator keeps run state so that a restart loses nothing.

A store saves and loads one JSON-able snapshot per run. That is all the
orchestrator asks of it, so a store on a distributed key-value engine (one key
per run, written in a transaction) can replace the file store without touching
the state machine. Membership changes are persisted, heartbeats are not.

:class:`GroupCommitter` batches saves: any number of changes made while a save
is running go out together in the next one, so 1,000 nodes joining at once
cost a handful of fsyncs, and every caller still waits until its change is on
disk before it is answered. It says when a save is durable (``on_durable``), so
that watchers hear only of changes a restart or a new leader will not undo.
"""

from __future__ import annotations

import abc
import asyncio
import fcntl
import hashlib
import json
import logging
import os
import tempfile
from typing import Any, Callable

Snapshot = dict[str, Any]

logger = logging.getLogger(__name__)


class MembershipStore(abc.ABC):
    """Durable storage of run snapshots, keyed by run id."""

    # False for a store that keeps nothing: then nobody waits for saves.
    persistent = True

    @property
    def leading(self) -> bool:
        """Whether this orchestrator may decide now: false for a replica whose lead ran out
        (its timers must not remove nodes it cannot save the removal of)."""
        return True

    @abc.abstractmethod
    def load(self) -> dict[str, Snapshot]:
        """Returns every saved run that can be read; sets the others aside."""

    @abc.abstractmethod
    def set_aside(self, run_id: str, reason: str) -> None:
        """Keeps a run that cannot be restored out of the way (and out of later loads), so that
        the other runs are served; says so once."""

    @abc.abstractmethod
    def save(self, run_id: str, snapshot: Snapshot) -> None:
        """Stores a run's snapshot; durable when it returns. Called off the event loop."""

    @abc.abstractmethod
    def delete(self, run_id: str) -> None:
        """Forgets a run (it expired); durable when it returns. Called off the event loop,
        never while a save of the run is under way."""

    def close(self) -> None:
        """Lets go of what the store holds (another orchestrator may use it next)."""


class StoreInUse(RuntimeError):
    """Another orchestrator holds the store."""


class MemoryStore(MembershipStore):
    """No persistence: state lives as long as the process (no --state_dir)."""

    persistent = False

    def load(self) -> dict[str, Snapshot]:
        return {}

    def save(self, run_id: str, snapshot: Snapshot) -> None:
        pass

    def delete(self, run_id: str) -> None:
        pass

    def set_aside(self, run_id: str, reason: str) -> None:
        pass  # it loads nothing, so nothing of it can be unreadable


class FileStore(MembershipStore):
    """One JSON file per run in a directory, replaced atomically and fsynced.

    A file is named after a hash of its run id (the id itself is inside): any
    id fits a file name. Files of the former naming (the id in hex) are renamed
    when loaded. An unreadable file is renamed to ``<name>.corrupt`` and kept.
    """

    _SUFFIX = ".run.json"
    _TEMP_PREFIX = ".tmp-"
    _SET_ASIDE_SUFFIX = ".corrupt"
    LOCK_NAME = ".lock"

    def __init__(self, directory: str):
        """Raises StoreInUse when another orchestrator holds the directory: a second one
        would delete the first one's temporary files and overwrite its saves."""
        self.directory = os.path.abspath(directory)
        os.makedirs(self.directory, exist_ok=True)
        self._lock = os.open(os.path.join(self.directory, self.LOCK_NAME),
                             os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._lock, 64, 0).decode(errors="replace").strip() or "?"
            os.close(self._lock)
            raise StoreInUse(
                f"the state directory {self.directory} is in use by another orchestrator "
                f"(pid {holder}); give each orchestrator its own --state_dir, or run replicas "
                f"on one etcd store (--store etcd://...)") from None
        os.ftruncate(self._lock, 0)
        os.pwrite(self._lock, f"{os.getpid()}\n".encode(), 0)

    def close(self) -> None:
        if self._lock >= 0:
            os.close(self._lock)  # releases the lock
            self._lock = -1

    def _path(self, run_id: str) -> str:
        return os.path.join(self.directory,
                            hashlib.sha256(run_id.encode()).hexdigest() + self._SUFFIX)

    def load(self) -> dict[str, Snapshot]:
        runs = {}
        for name in sorted(os.listdir(self.directory)):
            path = os.path.join(self.directory, name)
            if name.startswith(self._TEMP_PREFIX):
                # A save that kill -9 cut short; the file it was to replace is whole.
                os.unlink(path)
                continue
            if not name.endswith(self._SUFFIX):
                continue
            try:
                snapshot = _read_snapshot(path)
            except (OSError, ValueError) as e:
                self._set_aside_file(path, str(e))
                continue
            run_id = snapshot["run_id"]
            if path != self._path(run_id):
                os.replace(path, self._path(run_id))
            runs[run_id] = snapshot
        return runs

    def set_aside(self, run_id: str, reason: str) -> None:
        self._set_aside_file(self._path(run_id), reason)

    def _set_aside_file(self, path: str, reason: str) -> None:
        os.replace(path, path + self._SET_ASIDE_SUFFIX)
        logger.error("run state file %s cannot be restored (%s); moved it to %s and serving "
                     "the other runs", path, reason, path + self._SET_ASIDE_SUFFIX)

    def save(self, run_id: str, snapshot: Snapshot) -> None:
        data = json.dumps(snapshot, separators=(",", ":")).encode()
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=self._TEMP_PREFIX)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path(run_id))
        except BaseException:
            os.unlink(tmp)
            raise
        self._sync_directory()

    def delete(self, run_id: str) -> None:
        try:
            os.unlink(self._path(run_id))
        except FileNotFoundError:
            return
        self._sync_directory()

    def _sync_directory(self) -> None:
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _read_snapshot(path: str) -> Snapshot:
    """The snapshot in a file; ValueError unless it is a JSON object naming its run."""
    with open(path, "rb") as f:
        return check_snapshot(json.loads(f.read()))


def check_snapshot(snapshot: object) -> Snapshot:
    """``snapshot`` if it is a JSON object naming its run; ValueError otherwise."""
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("run_id"), str):
        raise ValueError("not a JSON object with a run_id")
    return snapshot


class GroupCommitter:
    """Saves a run's snapshot after changes, batching changes made during a save."""

    def __init__(self, store: MembershipStore, run_id: str, snapshot: Callable[[], Snapshot],
                 on_durable: Callable[[], None] = lambda: None):
        """``on_durable()`` is called on the loop after every save that succeeded (at once for
        a store that keeps nothing)."""
        self._store = store
        self._run_id = run_id
        self._snapshot = snapshot
        self._on_durable = on_durable
        self._changed = 0
        self._durable = 0
        self._writer: asyncio.Task | None = None
        # The error of the last save, until the next one starts.
        self._failed: BaseException | None = None
        self._saved = asyncio.Event()

    def mark(self) -> int:
        """Records that the state changed; returns a ticket for :meth:`wait`."""
        self._changed += 1
        if not self._store.persistent:
            self._durable = self._changed
            self._on_durable()
        elif self._writer is None or self._writer.done():
            self._failed = None
            self._writer = asyncio.get_running_loop().create_task(self._write())
        return self._changed

    @property
    def last_ticket(self) -> int:
        """The ticket of the latest change: waiting for it waits for every change so far."""
        return self._changed

    async def wait(self, ticket: int) -> None:
        """Returns once the change behind ``ticket`` (and all before it) is durable.

        Raises the store's error when the save failed (e.g. the disk is full).
        """
        while self._durable < ticket:
            if self._failed is not None:
                raise self._failed
            await self._saved.wait()

    async def _write(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._durable < self._changed:
                ticket = self._changed
                # The snapshot is taken on the loop, so it is consistent; only the I/O moves off it.
                snapshot = self._snapshot()
                await loop.run_in_executor(None, self._store.save, self._run_id, snapshot)
                self._durable = ticket
                self._on_durable()
                self._wake()
        except Exception as e:  # noqa: BLE001 - handed to every waiter
            self._failed = e
        finally:
            self._wake()

    def _wake(self) -> None:
        saved, self._saved = self._saved, asyncio.Event()
        saved.set()
