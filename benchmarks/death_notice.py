"""How soon a SIGKILLed TensorFlow worker's death can be known, and by what.

A killed process closes its files (its output pipe, its sockets: what the agent and the peers
see today) only after the kernel has torn down its memory; a robust mutex it holds in shared
memory is released (owner died, its waiter woken) as its thread exits, before that teardown.
Each of --repeats times: a process imports TensorFlow, runs an op, locks a robust process-shared
mutex in a file under /dev/shm and says so; this process waits on the mutex in a thread,
SIGKILLs it and times, from the kill: the waiter's wake (EOWNERDEAD), the output pipe's end of
file, the process reapable (waitid WNOWAIT). Linux and glibc only.

Prints one line per kill (lock_code 130: EOWNERDEAD) and, last, {"repeats", "owner_died_ms",
"pipe_eof_ms", "reapable_ms"}, each {"p50", "max"}.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

PTHREAD_PROCESS_SHARED = 1
PTHREAD_MUTEX_ROBUST = 1
MUTEX_BYTES = 64  # pthread_mutex_t is 40 bytes on x86-64 and aarch64 glibc

# The victim: locks the mutex (argv[1]), imports TensorFlow, runs an op, says "ready", sleeps.
VICTIM = r'''
import ctypes, mmap, sys, time
libc = ctypes.CDLL("libc.so.6")
f = open(sys.argv[1], "r+b"); m = mmap.mmap(f.fileno(), 64)
assert libc.pthread_mutex_lock(ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(m)))) == 0
import tensorflow as tf
tf.reduce_sum(tf.ones([1000, 1000])).numpy()
print("ready", flush=True)
time.sleep(3600)
'''


def shared_mutex(path: str, libc) -> tuple[mmap.mmap, ctypes.c_void_p]:
    with open(path, "wb") as f:
        f.write(b"\0" * MUTEX_BYTES)
    with open(path, "r+b") as f:
        memory = mmap.mmap(f.fileno(), MUTEX_BYTES)
    mutex = ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(memory)))
    attr = ctypes.create_string_buffer(8)
    libc.pthread_mutexattr_init(attr)
    libc.pthread_mutexattr_setpshared(attr, PTHREAD_PROCESS_SHARED)
    libc.pthread_mutexattr_setrobust(attr, PTHREAD_MUTEX_ROBUST)
    if libc.pthread_mutex_init(mutex, attr) != 0:
        raise OSError("pthread_mutex_init failed")
    return memory, mutex


def one_kill(path: str, libc) -> dict:
    memory, mutex = shared_mutex(path, libc)
    victim = subprocess.Popen([sys.executable, "-c", VICTIM, path], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL)
    if victim.stdout.readline().strip() != b"ready":
        raise RuntimeError("the victim did not start")
    woke: list[tuple[float, int]] = []

    def wait_for_the_mutex() -> None:
        code = libc.pthread_mutex_lock(mutex)
        woke.append((time.monotonic(), code))

    waiter = threading.Thread(target=wait_for_the_mutex)
    waiter.start()
    time.sleep(0.3)  # the waiter blocked in the lock
    killed = time.monotonic()
    os.kill(victim.pid, signal.SIGKILL)
    victim.stdout.read()
    eof = time.monotonic()
    os.waitid(os.P_PID, victim.pid, os.WEXITED | os.WNOWAIT)
    reapable = time.monotonic()
    waiter.join(timeout=30)
    victim.wait()
    woken, code = woke[0]
    libc.pthread_mutex_consistent(mutex)
    libc.pthread_mutex_unlock(mutex)
    memory.close()
    return {"owner_died_ms": round((woken - killed) * 1e3, 2), "lock_code": code,
            "pipe_eof_ms": round((eof - killed) * 1e3, 2),
            "reapable_ms": round((reapable - killed) * 1e3, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    libc = ctypes.CDLL("libc.so.6")
    kills = []
    with tempfile.TemporaryDirectory(prefix="tfe-death-", dir="/dev/shm") as tmp:
        for i in range(args.repeats):
            kills.append(one_kill(os.path.join(tmp, f"mutex-{i}"), libc))
            print(json.dumps(kills[-1]), flush=True)
    summary = {"repeats": len(kills)}
    for key in ("owner_died_ms", "pipe_eof_ms", "reapable_ms"):
        values = [k[key] for k in kills]
        summary[key] = {"p50": round(statistics.median(values), 2), "max": max(values)}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
