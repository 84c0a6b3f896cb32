"""Builds what test_collective_server.py loads, beside the multi-process tests (asan_build.py)."""

import os

from tests.ops import asan_build


def test_the_parts_the_sanitizer_scenario_loads_build_with_address_sanitizer(
        request, tmp_path_factory):
    built, preload = asan_build.library(asan_build.build_dir(request, tmp_path_factory))
    assert os.path.getsize(built) > 0
    assert "asan" in preload
