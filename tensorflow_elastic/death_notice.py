"""A worker's death known as it dies: a robust mutex the worker holds in memory it shares
with its agent.

A killed process closes its files (its pipe to the agent, its sockets to its peers) and can be
reaped only after the kernel has freed its memory: 30-45 ms for a TensorFlow process, more at
model sizes. The kernel releases the robust mutexes a thread holds as the thread exits, before
that: the agent's waiter wakes with EOWNERDEAD within a millisecond (benchmarks/death_notice.py),
and the agent tells the orchestrator at once. A worker that exits through Python (success or an
exception) releases the mutex first, so only deaths that skip the interpreter's exit (a signal,
a crash, ``os._exit``) are reported this way; their exit code comes later, when the process is
reaped, as for every worker.

Linux with glibc (robust process-shared mutexes); elsewhere, or where the notice cannot be set
up, nothing is and a death is known when the process is reaped. The kernel also releases a
robust mutex when its holder execs: the agent reports a death only for a process that is
exiting.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading
import time
from typing import Callable

PTHREAD_PROCESS_SHARED = 1
PTHREAD_MUTEX_ROBUST = 1
MUTEX_BYTES = 64  # pthread_mutex_t is 40 bytes on x86-64 and 48 on aarch64 glibc
# After the mutex, one int32 the worker sets: HELD once it holds the mutex (the agent may wait
# on it from then on; waiting before would take the mutex from the worker), RELEASED before a
# normal exit.
STATE_OFFSET = MUTEX_BYTES
NOT_HELD, HELD, RELEASED = 0, 1, 2
SHARED_BYTES = MUTEX_BYTES + 8
# The memfd's name; a descriptor the worker inherits is taken for a notice only under it.
NOTICE_NAME = "tfe-death-notice"
# How often a watcher looks whether its worker holds the mutex yet.
HELD_POLL_S = 0.05
# The kernel's flag of a task that is exiting (include/linux/sched.h), field 9 of /proc/PID/stat.
PF_EXITING = 0x4
# Where glibc keeps the pthread functions: libc from 2.34 on, libpthread before.
_PTHREAD_LIBRARIES = ("libc.so.6", "libpthread.so.0")


def _pthreads() -> ctypes.CDLL | None:
    """glibc's pthread functions, or None where robust mutexes are unavailable."""
    for name in _PTHREAD_LIBRARIES:
        try:
            library = ctypes.CDLL(name)
            library.pthread_mutexattr_setrobust  # noqa: B018 - present in glibc only
        except (OSError, AttributeError):
            continue
        return library
    return None


def is_exiting(pid: int) -> bool:
    """Whether process ``pid`` is exiting or gone (not, say, replaced by an exec)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return True
    return bool(int(fields[6]) & PF_EXITING)


class _Shared:
    """The mutex and its state word, mapped from ``fd``."""

    def __init__(self, fd: int, libc: ctypes.CDLL):
        self.libc = libc
        self.memory = mmap.mmap(fd, SHARED_BYTES)
        self.mutex = ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(self.memory)))
        self._state = ctypes.c_int32.from_buffer(self.memory, STATE_OFFSET)

    @property
    def state(self) -> int:
        return self._state.value

    @state.setter
    def state(self, value: int) -> None:
        self._state.value = value


class DeathNotice:
    """The agent's side, for one worker process: made before the worker starts (``fd`` and
    ``env`` go to it), watched once it runs."""

    def __init__(self, libc: ctypes.CDLL):
        self.fd = os.memfd_create(NOTICE_NAME, os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, SHARED_BYTES)
            self._shared = _Shared(self.fd, libc)
            attr = ctypes.create_string_buffer(16)  # pthread_mutexattr_t: 4 bytes
            libc.pthread_mutexattr_init(attr)
            libc.pthread_mutexattr_setpshared(attr, PTHREAD_PROCESS_SHARED)
            libc.pthread_mutexattr_setrobust(attr, PTHREAD_MUTEX_ROBUST)
            if libc.pthread_mutex_init(self._shared.mutex, attr) != 0:
                raise OSError("pthread_mutex_init of a robust process-shared mutex failed")
        except BaseException:
            os.close(self.fd)
            raise

    @classmethod
    def make(cls) -> DeathNotice | None:
        """A notice, or None where robust mutexes or shared memory are unavailable (the
        death is then known at the reap)."""
        libc = _pthreads()
        if libc is None or not hasattr(os, "memfd_create"):
            return None
        try:
            return cls(libc)
        except OSError:
            return None

    def passed(self) -> None:
        """The worker has its copy of the descriptor: the agent keeps only the mapping."""
        os.close(self.fd)

    def watch(self, pid: int, running: Callable[[], bool], on_death: Callable[[], None]) -> None:
        """Calls ``on_death`` (in a thread of its own) when worker ``pid`` dies holding the
        mutex; nothing when it released the mutex first, never held it (``running`` turned
        False: a worker that does not use the notice) or exec'd another program."""
        threading.Thread(target=self._wait, args=(pid, running, on_death), daemon=True,
                         name=NOTICE_NAME).start()

    def _wait(self, pid: int, running: Callable[[], bool], on_death: Callable[[], None]) -> None:
        shared, libc = self._shared, self._shared.libc
        while True:
            while shared.state != HELD:
                if shared.state == RELEASED or not running():
                    return
                time.sleep(HELD_POLL_S)
            owner_died = libc.pthread_mutex_lock(shared.mutex) == errno.EOWNERDEAD
            if owner_died:
                libc.pthread_mutex_consistent(shared.mutex)
            if not owner_died or shared.state == RELEASED:
                libc.pthread_mutex_unlock(shared.mutex)
                return
            if is_exiting(pid):
                libc.pthread_mutex_unlock(shared.mutex)
                on_death()
                return
            # It exec'd: the new program may hold the mutex again.
            shared.state = NOT_HELD
            libc.pthread_mutex_unlock(shared.mutex)


class Holder:
    """The worker's side: holds the mutex from ``hold`` until ``release``, on the thread that
    holds it (the main thread: it lives as long as the process)."""

    def __init__(self, fd: int, libc: ctypes.CDLL):
        try:
            self._shared = _Shared(fd, libc)
        finally:
            os.close(fd)
        self._holder_pid: int | None = None

    def hold(self) -> None:
        """Holds the mutex, never waiting for it: where it cannot (another holder), the notice
        stays off and the death is known at the reap. A mutex whose earlier holder died is
        taken over."""
        libc, mutex = self._shared.libc, self._shared.mutex
        locked = libc.pthread_mutex_trylock(mutex)
        if locked == errno.EOWNERDEAD:
            locked = libc.pthread_mutex_consistent(mutex)
        if locked != 0:
            return
        self._shared.state = HELD
        self._holder_pid = os.getpid()

    def release(self) -> None:
        """Before a normal exit: the agent is not told of a death. A forked child's exit
        leaves its parent's notice alone."""
        if self._holder_pid == os.getpid():
            self._shared.state = RELEASED
            self._shared.libc.pthread_mutex_unlock(self._shared.mutex)
            self._holder_pid = None


def holder_from_env(value: str | None) -> Holder | None:
    """The worker's holder for the descriptor its agent passed down (TFE_DEATH_NOTICE_FD), or
    None without one."""
    if not value:
        return None
    libc = _pthreads()
    if libc is None:
        return None
    try:
        fd = int(value)
        # A program that started another one without passing its descriptors on left the
        # variable, not the notice: that number may now be any file of the new program's.
        if (not os.readlink(f"/proc/self/fd/{fd}").startswith(f"/memfd:{NOTICE_NAME}")
                or os.fstat(fd).st_size < SHARED_BYTES):
            return None
        return Holder(fd, libc)
    except (OSError, ValueError):  # not a descriptor of a notice: the notice stays off
        return None
