"""The collective server's update right after aborted collectives, under AddressSanitizer: the
update must not free what the aborted calls still use (cc/python/collective_server.cc).

The test builds the part of the op library the scenario loads with AddressSanitizer
(tools/build_ops.py --asan; kept in pytest's cache until cc/ changes, built by
test_asan_build.py beside the multi-process tests: asan_build.py) and runs the scenario in a process that
preloads the sanitizer's runtime. By hand:

    python tools/build_ops.py --asan --out /tmp/asan/_ops.so
    LD_PRELOAD="$(g++ -print-file-name=libasan.so) $(g++ -print-file-name=libstdc++.so)" \\
        ASAN_OPTIONS=detect_leaks=0 python tests/ops/collective_abort_update.py /tmp/asan/_ops.so 10
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.ops import asan_build

pytestmark = pytest.mark.multiprocess

HERE = os.path.dirname(os.path.abspath(__file__))

ROUNDS = 10
RECOVERABLE = {"UnavailableError", "AbortedError", "CancelledError", "DeadlineExceededError"}


@pytest.fixture(scope="module")
def asan_library(request, tmp_path_factory) -> tuple[str, str]:
    """(the op library built with AddressSanitizer, what LD_PRELOAD needs to load it)."""
    return asan_build.library(asan_build.build_dir(request, tmp_path_factory))


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
