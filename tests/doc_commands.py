"""The commands the project documents, read from where users read them, for the tests that run
them as written, and the register that says which test runs each one.

A command block is a fenced block in README.md or docs/ (``bash``, ``sh``, ``shell``,
``console``; an unlabelled one or an indented code block whose lines start with a program), or
the command lines of a script's docstring. Its commands: continuations (a trailing backslash)
joined, a here-document kept with the command that opens it, ``# comments`` dropped. Blocks are
found by their content, never by line numbers, so a block that moves (to another line or another
page) keeps its test; a command that is new or changed has none until REGISTER says which test
runs it (or why it cannot run here, and which test checks what can be checked).

Tests substitute only what must differ on a test machine: a port, a placeholder such as HOST,
and paths into the checkout or a temporary directory.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import shlex
import shutil

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# How long a documented job of the project's examples may take, from its start to its end.
JOB_S = 240.0
SHELL_LANGUAGES = frozenset({"bash", "sh", "shell", "console", "zsh"})
# An unlabelled block is a command block when one of its lines starts with a program.
_UNLABELLED = frozenset({"", "text"})
_FENCE = re.compile(r"^(\s*)```\s*([\w-]*)\s*$")
_HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")
# The console scripts (pyproject.toml), as the docs call them (bare or from .venv/bin/), and the
# module each runs as ``python -m`` (``tfelastic-run`` is also python -m ...distributed.launch).
ENTRY_POINTS = {
    "tfelastic-run": "tensorflow_elastic.distributed.launch",
    "tfelastic": "tensorflow_elastic.cli",
    "tfelastic-orchestrator": "tensorflow_elastic.rendezvous",
    "tensorflowrun": "tensorflow_elastic.launch.tensorflowrun",
}
# Shell words after which the next word is a program again.
_SEPARATORS = frozenset({"&&", "||", ";", "|", "exec", "--", "then", "do"})


@dataclasses.dataclass(frozen=True)
class Block:
    """One code block: where it is and its text."""

    path: str   # relative to the repository root
    line: int   # of the opening fence (or first line), 1-based
    language: str
    text: str

    @property
    def commands(self) -> list[str]:
        if self.language == "console":
            return command_lines("\n".join(line.strip()[2:] for line in self.text.splitlines()
                                           if line.strip().startswith("$ ")))
        return command_lines(self.text)

    @property
    def is_commands(self) -> bool:
        """Shell commands: a shell block, or any other whose lines start with a program."""
        if self.language in SHELL_LANGUAGES:
            return bool(self.commands)
        return self.language in _UNLABELLED | {"indented"} and any(
            is_program(line.split()[0]) for line in self.commands if line.split())

    def where(self, command: str) -> str:
        """'path:line' of the line where ``command`` starts in this block."""
        for offset, line in enumerate(self.text.splitlines(), start=1):
            start = re.sub(r"\s+#.*$", "", line.strip().removeprefix("$ ")).rstrip("\\").strip()
            if start and not start.startswith("#") and command.startswith(start):
                return f"{self.path}:{self.line + offset}"
        return f"{self.path}:{self.line}"


def is_program(word: str) -> bool:
    """Whether a line's first word runs something (a console script, a path, a program)."""
    return (word.removeprefix(".venv/bin/") in ENTRY_POINTS or word.startswith(("./", ".venv/"))
            or word.endswith((".py", ".sh")) or shutil.which(word) is not None)


def command_lines(text: str) -> list[str]:
    """The block's commands: continuations joined, here-documents kept with their command,
    comments and blank lines dropped."""
    commands, pending, lines = [], "", text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index].strip()
        index += 1
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        line = (pending + line).strip()
        pending = ""
        line = re.sub(r"\s+#.*$", "", line) if not line.startswith("#") else ""
        heredoc = _HEREDOC.search(line)
        if heredoc:
            body = []
            while index < len(lines) and lines[index].strip() != heredoc.group(1):
                body.append(lines[index].rstrip())
                index += 1
            index += 1
            line = "\n".join([line, *body, heredoc.group(1)])
        if line:
            commands.append(line)
    return commands


def doc_files() -> list[str]:
    """README.md and every page under docs/, relative to the repository root."""
    pages = glob.glob(os.path.join(REPO_ROOT, "docs", "**", "*.md"), recursive=True)
    return ["README.md"] + sorted(os.path.relpath(p, REPO_ROOT) for p in pages)


def blocks(path: str) -> list[Block]:
    """Every code block of a markdown file (``path`` relative to the repository root): fenced
    (also inside a list) and indented ones."""
    found, language, start, body, indent = [], None, 0, [], ""
    previous_blank, indented, indented_start = True, [], 0
    with open(os.path.join(REPO_ROOT, path), encoding="utf-8") as f:
        lines = f.read().splitlines()
    for number, line in enumerate(lines, start=1):
        fence = _FENCE.match(line)
        if language is not None:
            if line.strip() == "```":
                found.append(Block(path, start, language, "".join(body)))
                language = None
            else:
                body.append((line[len(indent):] if line.startswith(indent) else line) + "\n")
            continue
        if fence:
            language, start, body, indent = fence.group(2), number, [], fence.group(1)
            continue
        if line.startswith(("    ", "\t")) and (indented or previous_blank):
            indented_start = indented_start if indented else number
            indented.append(line.strip() + "\n")
        elif indented and line.strip():
            found.append(Block(path, indented_start, "indented", "".join(indented)))
            indented = []
        previous_blank = not line.strip()
    if indented:
        found.append(Block(path, indented_start, "indented", "".join(indented)))
    return found


def command_blocks() -> list[Block]:
    """Every block of shell commands in README.md and docs/."""
    return [b for path in doc_files() for b in blocks(path) if b.is_commands]


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


def console_script_calls(command: str) -> list[tuple[str, list[str]]]:
    """Each console script a shell command calls, with its arguments up to the next shell
    separator: ``(script, args)``."""
    words = shlex.split(command.split("\n", 1)[0], comments=True)
    calls, current = [], None
    for word in words:
        if word in _SEPARATORS or word.endswith(";"):
            current = None
        elif current is not None:
            current[1].append(word)
        elif word.removeprefix(".venv/bin/") in ENTRY_POINTS:
            current = (word.removeprefix(".venv/bin/"), [])
            calls.append(current)
    return calls


def substitute(command: str, values: dict[str, str]) -> str:
    """``command`` with each placeholder (a key of ``values``) replaced, longest first."""
    for placeholder in sorted(values, key=len, reverse=True):
        command = command.replace(placeholder, values[placeholder])
    return command


# ------------------------------------------------------------------------------ the register

@dataclasses.dataclass(frozen=True)
class Runs:
    """A test runs the command as written (``note``: what it does not run, and why)."""

    test: str
    note: str = ""


@dataclasses.dataclass(frozen=True)
class NotRunnableHere:
    """The command needs what a test machine has not; ``test`` checks what can be checked
    (its shell syntax, its console scripts' flags, the files it names)."""

    reason: str
    test: str


_README = "tests/docs/test_readme_commands.py::"
_CHECKS = "tests/docs/test_command_register.py::test_what_cannot_run_here_is_checked"
_ORCHESTRATOR = "tests/docs/test_orchestrator_commands.py::test_a_secured_orchestrator"
_HA = "tests/docs/test_ha_commands.py::test_two_replicas_on_etcd"
_QUICKSTART = "tests/docs/test_quickstart_commands.py::test_the_quickstart"
_PS = ("tests/launch/test_ps_example.py::"
       "test_the_documented_example_converges_with_every_policy")
_KUBERNETES = "needs a Kubernetes cluster (kubectl talks to its API server)"
_SLURM = "a Slurm batch script: sbatch gets it hosts"

# Every documented command, exactly as the docs write it (continuations joined), and who runs it.
REGISTER: dict[str, Runs | NotRunnableHere] = {
    # README.md
    "./install.sh && .venv/bin/python examples/demo.py": Runs(
        _README + "test_the_demo",
        note="install.sh is not run: it builds the environment the suite runs in"),
    "./install.sh && .venv/bin/pytest": NotRunnableHere(
        "the whole suite, from inside the suite; install.sh builds the environment it runs in",
        _CHECKS),
    "pip install -v /path/to/tensorflow_elastic": NotRunnableHere(
        "compiles the op library for minutes and installs into the running environment "
        "(tests/ops run tools/build_ops.py's library)", _CHECKS),
    ".venv/bin/tfelastic-run --standalone --nproc_per_node=4 --nworkers=2:4 "
    "--events_file events.jsonl train.py":
        Runs(_README + "test_one_machine"),
    "openssl rand -hex 32 > token": Runs(_README + "test_a_shared_orchestrator"),  # also k8s
    ".venv/bin/tfelastic-orchestrator --host 0.0.0.0 --port 29400 --token_file token":
        Runs(_README + "test_a_shared_orchestrator"),
    ".venv/bin/tfelastic-run --rdzv_endpoint=HOST:29400 --token_file token --nnodes=2:4 "
    "--nproc_per_node=2 train.py": Runs(_README + "test_a_shared_orchestrator"),
    ".venv/bin/tfelastic status --rdzv_endpoint=HOST:29400 --token_file token":
        Runs(_README + "test_a_shared_orchestrator"),
    ".venv/bin/tfelastic status --events_file events.jsonl --watch":
        Runs(_README + "test_one_machine"),
    ".venv/bin/tfelastic plot events.jsonl -o timeline.png": Runs(  # also docs/quickstart.md
        _README + "test_one_machine"),
    # docs/quickstart.md (its plot command is README.md's, above)
    ".venv/bin/tfelastic-run --standalone --nproc_per_node 3 --nworkers 2:3 --events_file "
    "events.jsonl examples/keras_fit.py --epochs 3": Runs(_QUICKSTART),
    ".venv/bin/tfelastic status --events_file events.jsonl": Runs(_QUICKSTART),
    # docs/gpu.md
    ".venv/bin/python examples/check_devices.py": Runs(
        "tests/docs/test_gpu_commands.py::test_the_device_check",
        note="without a GPU here: its workers drive logical CPU devices"),
    # docs/ha.md
    "etcd --data-dir /var/lib/etcd ...": Runs(
        _HA, note="'...' stands for etcd's own flags: the etcd_server fixture gives them"),
    "tfelastic-orchestrator --host 0.0.0.0 --port 29400 --token_file /shared/token "
    "--store etcd://etcd1:2379,etcd2:2379,etcd3:2379/tfelastic/team-a "
    "--advertise $(hostname):29400": Runs(_HA),
    "tfelastic-run --rdzv_endpoint orch1:29400,orch2:29400 --token_file /shared/token "
    "--nnodes 2:4 train.py": Runs(_HA),
    "tfelastic status --rdzv_endpoint orch1:29400,orch2:29400 --token_file /shared/token":
        Runs(_HA),
    # docs/kubernetes.md (its "openssl rand -hex 32 > token" is README.md's, above)
    "kubectl create secret generic tfelastic-token --from-file=token=token && rm token":
        NotRunnableHere(_KUBERNETES, _CHECKS),
    "kubectl apply -f deploy/kubernetes/orchestrator.yaml": NotRunnableHere(_KUBERNETES, _CHECKS),
    "kubectl rollout status deployment/tfelastic-orchestrator": NotRunnableHere(
        _KUBERNETES, _CHECKS),
    "kubectl apply -f deploy/kubernetes/workers.yaml": NotRunnableHere(_KUBERNETES, _CHECKS),
    "kubectl logs -f -l app.kubernetes.io/name=tfelastic-worker --prefix": NotRunnableHere(
        _KUBERNETES, _CHECKS),
    "kubectl exec deploy/tfelastic-orchestrator -- tfelastic status --rdzv_endpoint "
    "localhost:29400 --token_file /etc/tfelastic/token/token": NotRunnableHere(
        _KUBERNETES, _CHECKS),
    "cat > discover.sh <<'SH'\n#!/bin/sh\nexec python3 -m "
    "tensorflow_elastic.launch.discovery.kubernetes \\\n"
    "    -l app.kubernetes.io/name=tfelastic-host --slots 1\nSH": NotRunnableHere(
        "the discovery script it writes asks a Kubernetes API server for pods", _CHECKS),
    "chmod +x discover.sh": NotRunnableHere("makes the discovery script above executable",
                                            _CHECKS),
    "tensorflowrun --min_nodes 2 --max_nodes 8 --discovery ./discover.sh --rdzv_endpoint "
    "\"$(hostname -i):29400\" python train.py": NotRunnableHere(_KUBERNETES, _CHECKS),
    # docs/orchestrator.md
    "openssl rand -hex 32 > /shared/tfelastic/token": Runs(_ORCHESTRATOR),
    "openssl req -x509 -newkey rsa:2048 -nodes -days 365 -subj \"/CN=orch.example\" "
    "-addext \"subjectAltName=DNS:orch.example\" -keyout orch.key -out /shared/tfelastic/orch.pem":
        Runs(_ORCHESTRATOR),
    "tfelastic-orchestrator --host 0.0.0.0 --port 29400 --state_dir /var/lib/tfelastic "
    "--token_file /shared/tfelastic/token --tls_cert /shared/tfelastic/orch.pem --tls_key orch.key":
        Runs(_ORCHESTRATOR),
    "tfelastic-run --rdzv_endpoint orch.example:29400 --nnodes 2:4 --nproc_per_node 2 "
    "--token_file /shared/tfelastic/token --tls_ca /shared/tfelastic/orch.pem train.py":
        Runs(_ORCHESTRATOR),
    "tfelastic status --rdzv_endpoint orch.example:29400 --token_file /shared/tfelastic/token "
    "--tls_ca /shared/tfelastic/orch.pem --watch": Runs(_ORCHESTRATOR),
    # docs/ps.md
    "tfelastic-run --role ps --ps_address 127.0.0.1:7070 --ps_checkpoint_dir ckpt "
    "examples/ps_train.py": Runs(_PS),
    "tfelastic-run --role worker --ps_address 127.0.0.1:7070 --nproc_per_node 3 "
    "examples/ps_train.py": Runs(_PS),
    "tfelastic ps-status --ps_address 127.0.0.1:7070": Runs(_PS),
    "tfelastic ps-configure --ps_address 127.0.0.1:7070 --synch_block_size 2 --asynch_max 4":
        Runs(_PS),
    # docs/slurm.md
    "source .venv/bin/activate": NotRunnableHere(_SLURM, _CHECKS),
    "cat > discover.sh <<'SH'\n#!/bin/sh\nexec python3 -m tensorflow_elastic.launch.discovery.slurm"
    "\nSH": NotRunnableHere(_SLURM, _CHECKS),
    "exec tensorflowrun --min_nodes 4 --max_nodes 8 --discovery ./discover.sh --rdzv_endpoint "
    "\"$(hostname):29400\" python train.py": NotRunnableHere(_SLURM, _CHECKS),
    "umask 077 && openssl rand -hex 32 > \"$HOME/.tfelastic-token-$SLURM_JOB_ID\"":
        NotRunnableHere(_SLURM, _CHECKS),
    "srun tfelastic-run --slurm --nproc_per_node 2 --token_file "
    "\"$HOME/.tfelastic-token-$SLURM_JOB_ID\" python train.py": NotRunnableHere(
        _SLURM + " (tests/launch/test_slurm.py runs --slurm under a fake srun)", _CHECKS),
    # docs/ha.md, etcd over TLS
    "tfelastic-orchestrator --host 0.0.0.0 --port 29400 --token_file /shared/token "
    "--store etcds://etcd1:2379,etcd2:2379/tfelastic/team-a --advertise $(hostname):29400 "
    "--etcd_ca ca.pem --etcd_cert client.pem --etcd_key client-key.pem "
    "--etcd_user orchestrator --etcd_password_file /shared/etcd-password": NotRunnableHere(
        "needs an etcd cluster's certificates and user (tests/rendezvous/"
        "test_etcd_security.py runs these flags against a TLS etcd it starts)", _CHECKS),
    # docs/kubernetes.md, the image, the network policy and the Indexed Job
    "docker build -t tfelastic:0.1.0 .": NotRunnableHere(
        "needs a Docker daemon (tests/deploy/test_dockerfile.py checks the Dockerfile with "
        "hadolint)", _CHECKS),
    "printf 'FROM tfelastic:0.1.0\\nCOPY train.py /app/train.py\\n' | docker build -t "
    "registry.example.com/tfelastic-train:0.1.0 -f - .": NotRunnableHere(
        "needs a Docker daemon", _CHECKS),
    "docker push registry.example.com/tfelastic-train:0.1.0": NotRunnableHere(
        "needs a Docker daemon and a registry", _CHECKS),
    "kubectl apply -f deploy/kubernetes/network-policy.yaml": NotRunnableHere(_KUBERNETES,
                                                                              _CHECKS),
    "kubectl apply -f deploy/kubernetes/workers-job.yaml": NotRunnableHere(_KUBERNETES, _CHECKS),
    "kubectl patch job tfelastic-worker --type=merge -p "
    "'{\"spec\":{\"completions\":4,\"parallelism\":4}}'": NotRunnableHere(_KUBERNETES,
                                                                             _CHECKS),
    "kubectl wait --for=condition=complete job/tfelastic-worker --timeout=24h": NotRunnableHere(
        _KUBERNETES, _CHECKS),
}

# Blocks that look like commands but are not, by their first line.
NOT_COMMANDS = {
    "tfelastic-orchestrator  (gRPC: membership, numbered generations, barriers, ids)":
        "README.md's diagram of the processes",
}


def documented_commands() -> list[tuple[Block, str]]:
    """Every command of every command block, with its block, in the docs' order."""
    return [(block, command) for block in command_blocks()
            if block.text.strip().splitlines()[0].strip() not in NOT_COMMANDS
            for command in block.commands]


def registered(test: str) -> list[str]:
    """The documented commands REGISTER gives to ``test`` (its name, or path::name), in
    the docs' order; each is there as written."""
    found = [command for _, command in documented_commands()
             if isinstance(REGISTER.get(command), Runs)
             and REGISTER[command].test.split("::")[-1] == test.split("::")[-1]]
    return list(dict.fromkeys(found))
