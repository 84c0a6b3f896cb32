"""The commands the project documents, read from where users read them, for the tests that run
them as written.

A command block is a fenced block in README.md or docs/ (or the command lines of a script's
docstring) whose lines are shell commands: continuations (a trailing backslash) are joined and
trailing ``# comments`` dropped. Tests substitute only what must differ on a test machine: a
port, a placeholder such as HOST, and paths into the checkout or a temporary directory.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FENCE = re.compile(r"^```(\w*)\s*$")
# The console scripts (pyproject.toml), as the docs call them (bare or from .venv/bin/), and the
# module each runs as ``python -m`` (``tfelastic-run`` is also python -m ...distributed.launch).
ENTRY_POINTS = {
    "tfelastic-run": "tensorflow_elastic.distributed.launch",
    "tfelastic": "tensorflow_elastic.cli",
    "tfelastic-orchestrator": "tensorflow_elastic.rendezvous",
    "tensorflowrun": "tensorflow_elastic.launch.tensorflowrun",
}

@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced block: where it is and its text."""

    path: str   # relative to the repository root
    line: int   # of the opening fence, 1-based
    language: str
    text: str

    @property
    def commands(self) -> list[str]:
        return command_lines(self.text)


def command_lines(text: str) -> list[str]:
    """The block's commands: continuations joined, comments and blank lines dropped."""
    commands, pending = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        line = (pending + line).strip()
        pending = ""
        line = re.sub(r"\s+#.*$", "", line) if not line.startswith("#") else ""
        if line:
            commands.append(line)
    return commands


def blocks(path: str) -> list[Block]:
    """Every fenced block of a markdown file (``path`` relative to the repository root)."""
    found, language, start, body = [], None, 0, []
    with open(os.path.join(REPO_ROOT, path), encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            fence = _FENCE.match(line.rstrip("\n"))
            if language is None and fence:
                language, start, body = fence.group(1), number, []
            elif language is not None and line.strip() == "```":
                found.append(Block(path, start, language, "".join(body)))
                language = None
            elif language is not None:
                body.append(line)
    return found


def docstring_commands(path: str) -> list[str]:
    """The indented command lines of a script's module docstring (``path`` from the root)."""
    with open(os.path.join(REPO_ROOT, path), encoding="utf-8") as f:
        source = f.read()
    docstring = source.split('"""')[1].replace("\\\\", "\\")
    lines = [line for line in docstring.splitlines() if line.startswith("    ")]
    return command_lines("\n".join(lines))


def block_with(path: str, needle: str) -> Block:
    """The one block of ``path`` whose text holds ``needle``."""
    [block] = [b for b in blocks(path) if needle in b.text]
    return block


def module_and_args(command: str, substitutions: dict[str, str]) -> tuple[str, list[str]]:
    """The module a documented console-script command runs, and its arguments; each word
    that is a key of ``substitutions`` is replaced by its value."""
    words = shlex.split(command)
    module = ENTRY_POINTS[words[0].removeprefix(".venv/bin/")]
    return module, [substitutions.get(word, word) for word in words[1:]]
