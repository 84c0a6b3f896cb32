"""Process-wide memory settings (glibc malloc, TensorFlow's tensor allocator) for workers and
servers that move large tensors.

Three costs of the defaults, measured in this project's processes:

* Page faults: allocations above the mmap threshold (128 KB, adapted upwards
  to at most 32 MB) get a fresh ``mmap`` and are returned with ``munmap``. A
  push or pull of a 4 MB tensor allocates and frees several such buffers, and
  faulting in fresh zeroed pages each time costs about ten times the copies
  themselves (11.8 ms vs 0.73 ms to build and serialize a 1M-float push).
  `keep_large_buffers()` raises the mmap and trim thresholds so freed buffers
  are reused (the parameter servers and their clients).
* Fragmentation: glibc gives threads up to 8 arenas per core, and a training
  worker's many TensorFlow, gRPC and runtime threads spread tensors over all of
  them; on the ~100 MB transformer of benchmarks/ (3 workers) an elastic
  worker's peak RSS was 1.31x a stock worker's with the defaults and 1.12-1.17x
  with 4 arenas (stock's own 50-100 MB lower too). `limit_arenas()` caps
  them for arenas created afterwards, so it is called before TensorFlow starts
  its threads where possible (`tensorflow_elastic.init()`).
* The tensor allocator: TensorFlow's default for CPU tensors in this build is
  oneDNN's (`MklCPUAllocator`); `TF_CPU_ALLOCATOR_USE_BFC` makes it a plain
  best-fit pool (BFC). On the ~100 MB transformer (perf, 4 blocks of 25 steps,
  no snapshot after the first) the elastic workers took 2.8 % more CPU samples
  than stock's with the pool, 5.2 % in the same kind of run without it.
  `pool_tensors()` sets the variable (`tensorflow_elastic.init()`); TensorFlow
  caps the pool at 64 GB per process (`TF_CPU_BFC_MEM_LIMIT_IN_MB`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
# The largest threshold every glibc accepts (half its 64 MB heap size).
MMAP_THRESHOLD_BYTES = 32 << 20
TRIM_THRESHOLD_BYTES = 128 << 20
# Arenas a worker may use when MALLOC_ARENA_MAX does not say otherwise.
WORKER_ARENAS = 4
# TensorFlow reads it when it creates its CPU device (at the first op), not at import.
TENSOR_POOL_ENV = "TF_CPU_ALLOCATOR_USE_BFC"


@functools.cache
def _mallopt():
    """glibc's mallopt, or None where there is no glibc."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return mallopt


@functools.cache
def keep_large_buffers() -> bool:
    """Tunes glibc malloc once per process; False where there is no glibc (nothing changes)."""
    mallopt = _mallopt()
    return mallopt is not None and bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
                                        and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))


@functools.cache
def limit_arenas(count: int = WORKER_ARENAS) -> bool:
    """Caps glibc's malloc arenas at `count` unless the user set MALLOC_ARENA_MAX (which glibc
    read at start); False where nothing changed."""
    if count < 1:
        raise ValueError(f"an arena count must be >= 1, got {count}")
    mallopt = _mallopt()
    if mallopt is None or os.environ.get("MALLOC_ARENA_MAX"):
        return False
    return bool(mallopt(_M_ARENA_MAX, count))


def pool_tensors() -> bool:
    """Has TensorFlow allocate CPU tensors from its BFC pool unless the user set
    TF_CPU_ALLOCATOR_USE_BFC; False where nothing changed. It takes effect only
    before this process's first TensorFlow op."""
    if os.environ.get(TENSOR_POOL_ENV) is not None:
        return False
    os.environ[TENSOR_POOL_ENV] = "true"
    return True
