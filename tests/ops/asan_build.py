"""The op library's parts that tests/ops/collective_abort_update.py loads, built with
AddressSanitizer once per change of cc/ into a directory both test processes share.

A unit test builds it (test_asan_build.py), so the build runs beside the multi-process tests
rather than in their queue; the multi-process test that needs it waits for that build (a file
lock) or, run alone, builds it itself.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import subprocess

import pytest

from tools import build_ops

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# What the scenario loads: the collective server and the Python binding (which also carries the
# variable snapshots'). The rest of the op library is not built for it: half the build's time.
ASAN_SOURCES = ("cc/python/*.cc", "cc/kernels/variable_snapshot*.cc", "cc/ops/variable_snapshot_op.cc")


def _sources_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(ROOT, "cc", "**", "*"), recursive=True)):
        if os.path.isfile(path):
            digest.update(os.path.relpath(path, ROOT).encode())
            with open(path, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()[:16]


def build_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """pytest's cache (shared by the test processes), or a temporary directory without it."""
    cache = getattr(request.config, "cache", None)  # none with -p no:cacheprovider
    where = cache.mkdir("asan-ops") if cache is not None else tmp_path_factory.mktemp("asan-ops")
    return str(where)


def library(where: str) -> tuple[str, str]:
    """(the library built with AddressSanitizer, what LD_PRELOAD needs to load it); skips
    the test where the compiler has no sanitizer runtime."""
    try:
        runtime = build_ops.asan_runtime()
        stdcxx = os.path.realpath(subprocess.run(
            ["g++", "-print-file-name=libstdc++.so"], capture_output=True, text=True,
            timeout=60).stdout.strip())
    except build_ops.BuildError as e:
        pytest.skip(str(e))
    built = os.path.join(where, f"_ops-{_sources_digest()}.so")
    with open(os.path.join(where, "build.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other test process may be building it
        if not os.path.exists(built):
            import pybind11

            build_ops.build(ROOT, built + ".tmp", build_ops.probe_tensorflow(),
                            pybind11.get_include(), asan=True, log=lambda message: None,
                            sources=ASAN_SOURCES)
            os.replace(built + ".tmp", built)
    # libstdc++ too: matplotlib's module throws C++ exceptions, which the sanitizer intercepts.
    return built, f"{runtime} {stdcxx}"
