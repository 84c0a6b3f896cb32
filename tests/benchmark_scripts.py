"""Loads a benchmark script (benchmarks/NAME.py) as a module, for tests of its pure parts."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import types
from typing import Iterator

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "benchmarks")


@contextlib.contextmanager
def loaded(name: str) -> Iterator[types.ModuleType]:
    """benchmarks/`name`.py as module ``benchmark_<name>``, with its folder on sys.path while
    it is used (a script imports its harness as a sibling)."""
    module_name = f"benchmark_{name}"
    sys.path.insert(0, BENCHMARKS)
    try:
        spec = importlib.util.spec_from_file_location(module_name,
                                                      os.path.join(BENCHMARKS, f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(BENCHMARKS)
        sys.modules.pop(module_name, None)
