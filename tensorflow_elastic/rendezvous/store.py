"""Where the orchestrator keeps run state so that a restart loses nothing.

A store saves and loads one JSON-able snapshot per run. That is all the
orchestrator asks of it, so a store on a distributed key-value engine (one key
per run, written in a transaction) can replace the file store without touching
the state machine. Membership changes are persisted, heartbeats are not. A
snapshot to save carries only the node records that changed; the store keeps
the others in a log it compacts (node_log.py), and a load gives the whole run.

:class:`GroupCommitter` batches saves: any number of changes made while a save
is running go out together in the next one, so 1,000 nodes joining at once
cost a handful of fsyncs, and every caller still waits until its change is on
disk before it is answered. Saves of newcomers' joins start at least
:data:`SAVE_SPACING_S` apart: a save of a few changes costs about as much CPU as
one of many (1-2 ms), and a flood of joins would otherwise keep one save running
after the other on the orchestrator's cores (etcd answers in a few ms). A change
that members wait on (a removal, a formation, a barrier) is saved at once. It says when a save is durable (``on_durable``), so
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

from tensorflow_elastic.rendezvous import node_log
from tensorflow_elastic.rendezvous.node_log import NodeTable

Snapshot = dict[str, Any]

# The least time from one save's start to the next one's: a change made longer than this
# after the last save started is saved at once.
SAVE_SPACING_S = 0.03

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
        """Stores a run's snapshot (its node records: those that changed since the last save
        that returned); durable when it returns. Called off the event loop, one save of a
        run at a time."""

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
    """Per run, a JSON header file replaced atomically and fsynced, and a log of node records.

    A file is named after a hash of its run id (the id itself is inside): any
    id fits a file name. Files of the former naming (the id in hex) are renamed
    when loaded. An unreadable file is renamed to ``<name>.corrupt`` and kept.

    A save appends its changed node records to the run's log file as one line
    (fsynced), then replaces the header, which names the log file and how many
    of its bytes it covers: bytes past that (a save cut short) are cut off at the
    next load. A new base goes to a new log file that only the next header
    names; the former one is deleted after it.
    """

    _SUFFIX = ".run.json"
    _LOG_SUFFIX = ".nodes"
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
        # run id -> its node records as saved, and (log file name, bytes the header covers).
        self._tables: dict[str, NodeTable] = {}
        self._logs: dict[str, tuple[str, int]] = {}

    def close(self) -> None:
        if self._lock >= 0:
            os.close(self._lock)  # releases the lock
            self._lock = -1

    def _path(self, run_id: str) -> str:
        return os.path.join(self.directory, _digest(run_id) + self._SUFFIX)

    def load(self) -> dict[str, Snapshot]:
        runs = {}
        self._tables.clear()
        self._logs.clear()
        logs = []
        for name in sorted(os.listdir(self.directory)):
            path = os.path.join(self.directory, name)
            if name.startswith(self._TEMP_PREFIX):
                # A save that kill -9 cut short; the file it was to replace is whole.
                os.unlink(path)
                continue
            if name.endswith(self._LOG_SUFFIX):
                logs.append(name)
                continue
            if not name.endswith(self._SUFFIX):
                continue
            try:
                snapshot = self._read_run(path)
            except (OSError, ValueError) as e:
                self._set_aside_file(path, str(e))
                continue
            run_id = snapshot["run_id"]
            if path != self._path(run_id):
                os.replace(path, self._path(run_id))
            runs[run_id] = snapshot
        self._drop_unnamed_logs(logs)
        return runs

    def _read_run(self, path: str) -> Snapshot:
        """The whole snapshot of a header file and the log it names; ValueError when either
        cannot be read. A log's bytes past what the header covers are cut off."""
        header = _read_snapshot(path)
        log = header.get(node_log.LOG_FIELD)
        if log is None:
            return header  # the former whole-snapshot format
        try:
            name, length = log["file"], log["bytes"]
            own = (isinstance(name, str) and isinstance(length, int)
                   and name.startswith(_digest(header["run_id"]) + ".")
                   and name.endswith(self._LOG_SUFFIX) and os.sep not in name)
        except (TypeError, KeyError):
            own = False
        if not own:
            raise ValueError("its header names no node log of its own")
        log_path = os.path.join(self.directory, name)
        with open(log_path, "rb") as f:
            data = f.read(length + 1)
        if len(data) < length:
            raise ValueError(f"its node log {name} has {len(data)} of the {length} bytes "
                             f"its header names")
        table = NodeTable()
        for line in data[:length].splitlines():
            table.apply(json.loads(line))
        if len(data) > length:
            os.truncate(log_path, length)
        self._tables[header["run_id"]] = table
        self._logs[header["run_id"]] = (name, length)
        return node_log.joined(header, table)

    def _drop_unnamed_logs(self, names: list[str]) -> None:
        """Deletes the node logs that no header names: of loaded runs (a new base cut short,
        or the base it replaced) and of runs with no header at all (a delete cut short). A
        run set aside keeps its logs, to be looked at."""
        named = {log_name for log_name, _ in self._logs.values()}
        loaded = {_digest(run_id) for run_id in self._logs}
        headers = {name.split(".", 1)[0] for name in os.listdir(self.directory)
                   if name.endswith((self._SUFFIX, self._SUFFIX + self._SET_ASIDE_SUFFIX))}
        for name in names:
            digest = name.split(".", 1)[0]
            if name not in named and (digest in loaded or digest not in headers):
                os.unlink(os.path.join(self.directory, name))

    def set_aside(self, run_id: str, reason: str) -> None:
        self._tables.pop(run_id, None)
        self._logs.pop(run_id, None)
        self._set_aside_file(self._path(run_id), reason)

    def _set_aside_file(self, path: str, reason: str) -> None:
        os.replace(path, path + self._SET_ASIDE_SUFFIX)
        logger.error("run state file %s cannot be restored (%s); moved it to %s and serving "
                     "the other runs", path, reason, path + self._SET_ASIDE_SUFFIX)

    def save(self, run_id: str, snapshot: Snapshot) -> None:
        header, changes = node_log.split(snapshot)
        table, log = self._tables.get(run_id), self._logs.get(run_id)
        new_base = table is None or log is None or table.compacts_with(changes)
        replaced = log
        try:
            if new_base:
                table = (table or NodeTable()).after(changes)
                log = (f"{_digest(run_id)}.{os.urandom(4).hex()}{self._LOG_SUFFIX}", 0)
                log = (log[0], self._append(log, table.base()))
            elif changes:
                log = (log[0], self._append(log, changes))
            header[node_log.LOG_FIELD] = {"file": log[0], "bytes": log[1]}
            self._replace_header(run_id, header)
        except BaseException:
            # The header on disk may cover this save's bytes or not (its directory's sync
            # comes after the rename): the next save writes a new base to a new file rather
            # than over bytes a header may cover. The next load drops the logs left unnamed.
            self._logs.pop(run_id, None)
            raise
        if not new_base:
            table.apply(changes)
        self._tables[run_id], self._logs[run_id] = table, log
        if new_base and replaced is not None:
            os.unlink(os.path.join(self.directory, replaced[0]))

    def _append(self, log: tuple[str, int], records: list) -> int:
        """Writes ``records`` as one line at the end of what the header covers (bytes past it
        are a save cut short) and fsyncs; returns the log's new length."""
        name, length = log
        line = json.dumps(records, separators=(",", ":")).encode() + b"\n"
        fd = os.open(os.path.join(self.directory, name), os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, length)
            os.pwrite(fd, line, length)
            os.fsync(fd)
        finally:
            os.close(fd)
        return length + len(line)

    def _replace_header(self, run_id: str, header: Snapshot) -> None:
        data = json.dumps(header, separators=(",", ":")).encode()
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
        self._tables.pop(run_id, None)
        log = self._logs.pop(run_id, None)
        try:
            os.unlink(self._path(run_id))
        except FileNotFoundError:
            return
        if log is not None:
            os.unlink(os.path.join(self.directory, log[0]))
        self._sync_directory()

    def _sync_directory(self) -> None:
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _digest(run_id: str) -> str:
    return hashlib.sha256(run_id.encode()).hexdigest()


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
        self._last_start = float("-inf")  # loop time
        # Set by a change that members wait on: the next save starts without the spacing.
        self._urgent = asyncio.Event()

    def mark(self, urgent: bool = True) -> int:
        """Records that the state changed; returns a ticket for :meth:`wait`. Only changes
        that are not ``urgent`` (a newcomer queued: thousands come together) wait for the
        spacing; a re-form's removal, formation and barrier are on the members' path back to
        training and are saved at once."""
        self._changed += 1
        if urgent:
            self._urgent.set()
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
                wait = self._last_start + SAVE_SPACING_S - loop.time()
                if wait > 0 and not self._urgent.is_set():
                    try:
                        await asyncio.wait_for(self._urgent.wait(), wait)
                    except asyncio.TimeoutError:
                        pass
                self._urgent.clear()
                self._last_start = loop.time()
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
