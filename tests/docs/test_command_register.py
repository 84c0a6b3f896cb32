"""Every command README.md and docs/ show has a test that runs it as written, or a reason it
cannot run here and a check of what can be checked: a new or changed command fails here, naming
its file and line, until the register (tests/doc_commands.py) says which test runs it."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.doc_commands import (NOT_COMMANDS, REGISTER, REPO_ROOT, NotRunnableHere, Runs,
                                blocks, command_blocks, console_script_calls,
                                documented_commands, substitute)
from tests.docs.commands import PARSERS

# What the not-runnable commands' placeholders stand for on this machine.
PLACEHOLDERS = {"/path/to/tensorflow_elastic": REPO_ROOT}
# Created by the install (.venv) or by the documented block itself (discover.sh), or the user's.
_NOT_THE_PROJECTS = {".venv", "discover.sh", "train.py", "token"}


def test_every_documented_command_has_a_registered_test():
    missing = [f"{block.where(command)}: {command!r}" for block, command in documented_commands()
               if command not in REGISTER]
    assert not missing, (
        "no test runs these documented commands; add each to tests/doc_commands.REGISTER with "
        "the test that runs it as written (Runs), or why it cannot run here "
        "(NotRunnableHere):\n" + "\n".join(missing))


def test_every_registration_is_a_documented_command_with_a_test_that_exists():
    documented = {command for _, command in documented_commands()}
    stale = [command for command in REGISTER if command not in documented]
    assert not stale, ("registered commands the docs no longer show (update their tests and "
                       "the register):\n" + "\n".join(map(repr, stale)))
    for command, registration in REGISTER.items():
        path, name = registration.test.split("::")
        with open(os.path.join(REPO_ROOT, path), encoding="utf-8") as f:
            functions = {node.name for node in ast.walk(ast.parse(f.read()))
                         if isinstance(node, ast.FunctionDef)}
        assert name in functions, f"{registration.test} (registered for {command!r}) is missing"
        assert isinstance(registration, Runs) or registration.reason


def test_the_diagrams_that_look_like_commands_are_still_there():
    firsts = {block.text.strip().splitlines()[0].strip() for block in command_blocks()}
    assert set(NOT_COMMANDS) <= firsts


def _repository_paths(command: str) -> list[str]:
    """The words of ``command`` that name a file of the checkout (relative paths to a file
    name with an extension, whose first part is at the checkout's top), placeholders
    substituted."""
    words = shlex.split(substitute(command.split("\n", 1)[0], PLACEHOLDERS), comments=True)
    top = set(os.listdir(REPO_ROOT)) - _NOT_THE_PROJECTS
    named = []
    for word in words:
        for part in word.split("="):
            path = part.removeprefix("./")
            if os.path.isabs(path) and path.startswith(REPO_ROOT):
                named.append(path)
            elif path.split("/")[0] in top and "." in path.rsplit("/", 1)[-1]:
                named.append(os.path.join(REPO_ROOT, path))
    return named


NOT_RUNNABLE = sorted(command for command, r in REGISTER.items()
                      if isinstance(r, NotRunnableHere))


@pytest.mark.parametrize("command", NOT_RUNNABLE, ids=lambda c: c.split("\n")[0][:60])
def test_what_cannot_run_here_is_checked(command):
    # Shell syntax, with its here-document.
    check = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True,
                           timeout=30)
    assert check.returncode == 0, check.stderr
    # Each console script's flags parse with its own argparse.
    for script, args in console_script_calls(command):
        build, _ = PARSERS[script]
        build().parse_args(args)
    # Every module it runs with python -m exists; every file of the checkout it names is there.
    for module in re.findall(r"python3? -m ([\w.]+)", command):
        assert importlib.util.find_spec(module) is not None, module
    for path in _repository_paths(command):
        assert os.path.exists(path), f"{command!r} names {path}, which does not exist"
    # A script it runs takes the flags it is given.
    for script, flags in re.findall(r"python (\S+\.py)((?: --\w+(?: \S+)?)*)", command):
        if os.path.join(REPO_ROOT, script) not in _repository_paths(command):
            continue  # the user's script
        usage = subprocess.run([sys.executable, os.path.join(REPO_ROOT, script), "--help"],
                               capture_output=True, text=True, timeout=120,
                               env=dict(os.environ, PYTHONPATH=REPO_ROOT))
        assert usage.returncode == 0, usage.stderr
        for flag in re.findall(r"--\w+", flags):
            assert flag in usage.stdout, f"{script} has no {flag}"


def test_a_pip_install_path_is_the_checkout():
    [command] = [c for c in NOT_RUNNABLE if c.startswith("pip install")]
    [path] = _repository_paths(command)
    assert os.path.exists(os.path.join(path, "pyproject.toml"))


MARKDOWN = '''# A page

```bash
tfelastic-run --standalone train.py   # one machine
.venv/bin/tfelastic status --events_file events.jsonl \\
    --watch
```

1. In a list:

   ```sh
   cat > discover.sh <<'SH'
   #!/bin/sh
   exec python3 -m mod
   SH
   ```

```console
$ tfelastic plot events.jsonl -o t.png
wrote t.png
```

```
tfelastic-orchestrator --port 29400
```

```
[node 3] some output
```

```python
import tensorflow_elastic
```

Then:

    tfelastic-run --role ps train.py
'''


def test_discovery_finds_every_kind_of_command_block_by_its_content(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(MARKDOWN)
    commands = [(b.language, b.line, b.commands) for b in blocks(str(page)) if b.is_commands]
    assert commands == [
        ("bash", 3, ["tfelastic-run --standalone train.py",
                     ".venv/bin/tfelastic status --events_file events.jsonl --watch"]),
        ("sh", 11, ["cat > discover.sh <<'SH'\n#!/bin/sh\nexec python3 -m mod\nSH"]),
        ("console", 18, ["tfelastic plot events.jsonl -o t.png"]),
        ("", 23, ["tfelastic-orchestrator --port 29400"]),
        ("indented", 37, ["tfelastic-run --role ps train.py"]),
    ]
    [block] = [b for b in blocks(str(page)) if b.language == "bash"]
    assert block.where(block.commands[1]) == f"{page}:5"
