"""Documented commands run as written: in a directory that looks like an installed checkout.

The test's directory holds the checkout's files (links) and ``.venv/bin`` with the console
scripts and ``python`` of the environment under test, also first on PATH, so a command runs
through bash exactly as the docs write it, after the placeholders are substituted; the files it
writes (a token, events.jsonl, timeline.png) stay in the test's directory.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from typing import Callable, Iterator

import pytest

from tests.doc_commands import ENTRY_POINTS, JOB_S, REPO_ROOT, substitute
from tests.launch.conftest import Proc, port, start  # noqa: F401 - the launcher tests' fixtures

_NOT_LINKED = {".git", ".venv", "__pycache__"}


def _script(path, body: str) -> None:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


@pytest.fixture
def shell(start, tmp_path, monkeypatch) -> Iterator[Callable[..., Proc]]:
    """shell(command, placeholders) starts a documented command with bash in the test's
    directory; each placeholder (a key of ``placeholders``) is replaced by its value."""
    for name in os.listdir(REPO_ROOT):
        if name not in _NOT_LINKED and not (tmp_path / name).exists():
            (tmp_path / name).symlink_to(os.path.join(REPO_ROOT, name))
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for script, module in ENTRY_POINTS.items():
        _script(bin_dir / script, f'exec "{sys.executable}" -m {module} "$@"')
    for python in ("python", "python3"):
        _script(bin_dir / python, f'exec "{sys.executable}" "$@"')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def run(command: str, placeholders: dict[str, str] | None = None) -> Proc:
        text = substitute(command, placeholders or {})
        return start(module="", wrap=lambda argv: ["bash", "-c", text])

    # A suite started in the background of a script (`pytest &`) ignores SIGINT, and a command
    # started with it ignored cannot take it back: the documented Ctrl-C would reach nothing.
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    yield run
    if ignored:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.fixture
def two_machines(shell) -> Callable[..., None]:
    """two_machines(launcher, status, placeholders): the documented launcher command on two
    machines (here both on this one), the documented status while they train (it answers
    with the generation), and both to the job's end."""

    def run(launcher: str, status: str, placeholders: dict[str, str]) -> None:
        machines = [shell(launcher, placeholders) for _ in range(2)]
        machines[0].wait_for(r"\] step \d+ loss", timeout=JOB_S)  # the job trains
        look = shell(status, placeholders)
        assert look.wait() == 0, look.tail()
        assert re.search(r"generation \d+", look.output), look.output
        for machine in machines:
            assert machine.wait(JOB_S) == 0, machine.tail()

    return run
