"""The collective server's update right after aborted collectives, under AddressSanitizer: the
update must not free what the aborted calls still use (cc/python/collective_server.cc).

The test builds the part of the op library the scenario loads with AddressSanitizer
(tools/build_ops.py --asan; kept in pytest's cache until cc/ changes) and runs the scenario in a process that
preloads the sanitizer's runtime. By hand:

    python tools/build_ops.py --asan --out /tmp/asan/_ops.so
    LD_PRELOAD="$(g++ -print-file-name=libasan.so) $(g++ -print-file-name=libstdc++.so)" \\
        ASAN_OPTIONS=detect_leaks=0 python tests/ops/collective_abort_update.py /tmp/asan/_ops.so 10
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import subprocess
import sys

import pytest

from tools import build_ops

# One build job and one process: about one core, no timing; beside the multi-process tests.
pytestmark = [pytest.mark.multiprocess, pytest.mark.light]

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

ROUNDS = 10
# What the scenario loads: the collective server and the Python binding (which also carries the
# variable snapshots'). The rest of the op library is not built for it: half the build's time.
ASAN_SOURCES = ("cc/python/*.cc", "cc/kernels/variable_snapshot*.cc", "cc/ops/variable_snapshot_op.cc")
RECOVERABLE = {"UnavailableError", "AbortedError", "CancelledError", "DeadlineExceededError"}


def _sources_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(ROOT, "cc", "**", "*"), recursive=True)):
        if os.path.isfile(path):
            digest.update(os.path.relpath(path, ROOT).encode())
            with open(path, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="module")
def asan_library(request, tmp_path_factory) -> tuple[str, str]:
    """(the op library built with AddressSanitizer, what LD_PRELOAD needs to load it)."""
    try:
        runtime = build_ops.asan_runtime()
        stdcxx = os.path.realpath(subprocess.run(
            ["g++", "-print-file-name=libstdc++.so"], capture_output=True, text=True).stdout.strip())
    except build_ops.BuildError as e:
        pytest.skip(str(e))
    cache = getattr(request.config, "cache", None)  # none with -p no:cacheprovider
    where = cache.mkdir("asan-ops") if cache is not None else tmp_path_factory.mktemp("asan-ops")
    library = os.path.join(str(where), f"_ops-{_sources_digest()}.so")
    if not os.path.exists(library):
        import pybind11

        build_ops.build(ROOT, library + ".tmp", build_ops.probe_tensorflow(),
                        pybind11.get_include(), asan=True, jobs=1, log=lambda message: None,
                        sources=ASAN_SOURCES)
        os.replace(library + ".tmp", library)
    # libstdc++ too: matplotlib's module throws C++ exceptions, which the sanitizer intercepts.
    return library, f"{runtime} {stdcxx}"


def test_an_update_right_after_aborted_collectives_frees_nothing_they_still_use(
        asan_library, subprocess_env):
    library, preload = asan_library
    env = dict(subprocess_env, LD_PRELOAD=preload, TF_CPP_MIN_LOG_LEVEL="3",
               ASAN_OPTIONS="detect_leaks=0:halt_on_error=1")
    done = subprocess.run([sys.executable, os.path.join(HERE, "collective_abort_update.py"),
                           library, str(ROUNDS)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert "AddressSanitizer" not in done.stderr, done.stderr[-6000:]
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["rounds"] == ROUNDS
    assert set(result["errors"]) <= RECOVERABLE, result
