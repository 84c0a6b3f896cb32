"""The docs and the command-line parsers agree: every flag a documented command line gives one
of the package's commands exists, and docs/reference/cli.md documents every flag."""

from __future__ import annotations

import re

import pytest

from tests.docs import commands, markdown

REFERENCE = "docs/reference/cli.md"


@pytest.mark.parametrize("page", markdown.pages())
def test_documented_command_lines_use_existing_flags(page):
    unknown = [f"{flag} (in: {line})" for line in commands.command_lines(page)
               for flag in commands.unknown_flags(line)]
    assert unknown == []


def test_the_reference_documents_every_flag():
    text = markdown.read(REFERENCE)
    written = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", text))
    written |= {w.replace("-", "_").replace("__", "--", 1) for w in written}
    missing = []
    for command, parser in commands.parsers().items():
        for action in commands.options(parser):
            if not any(o in written or o.replace("-", "_").replace("__", "--", 1) in written
                       for o in action.option_strings):
                missing.append(f"{command} {action.option_strings[0]}")
    assert missing == []


def test_the_check_finds_a_flag_the_parser_lacks():
    assert commands.unknown_flags(".venv/bin/tfelastic-run --standalone --nproc_per_node 2 "
                                  "--no_such_flag 1 train.py --epochs 3") == \
        ["tfelastic-run --no_such_flag"]
    assert commands.unknown_flags("tfelastic status --rdzv_endpoint H:1 --bogus") == \
        ["tfelastic status --bogus"]
    assert commands.unknown_flags("tfelastic-run --address=$(hostname -i):5556 --nnodes=2:3 "
                                  "train.py --anything") == []


# Flags the user pages name in prose that belong to other tools, and whose.
OTHER_TOOLS_FLAGS = {
    "--help": "every command", "--version": "the launchers",
    "--election-timeout": "etcd", "--no-deps": "pip", "-v": "pip", "--replicas": "kubectl scale",
    "--learning_rate": "examples/ps_train.py",
    "--workers": "examples/check_devices.py", "--cpu_devices": "examples/check_devices.py",
    "--local-addr": "torchrun", "--master-addr": "torchrun", "--master-port": "torchrun",
    "--node-rank": "torchrun", "--rdzv-backend": "torchrun", "--rdzv-conf": "torchrun",
    "--rdzv-id": "torchrun", "--redirects": "torchrun", "--tee": "torchrun",
}


def test_flags_named_in_prose_exist():
    """A flag named on its own (`--heartbeat_timeout`) is one of the package's commands' (in
    either spelling) or one of OTHER_TOOLS_FLAGS."""
    known = set(OTHER_TOOLS_FLAGS)
    for parser in commands.parsers().values():
        for action in commands.options(parser):
            for option in action.option_strings:
                known |= {option, option.replace("_", "-"),
                          option.replace("-", "_").replace("__", "--", 1)}
    unknown = []
    for page in markdown.pages():
        if page.startswith(("docs/design/", "benchmarks/")):   # benchmarks' own flags
            continue
        for line in markdown.prose_lines(markdown.read(page)):
            for span in re.findall(r"`([^`]+)`", line):
                flag = re.match(r"^(--?[A-Za-z][\w-]*)", span)
                if flag and flag.group(1) not in known:
                    unknown.append(f"{page}: {flag.group(1)}")
    assert unknown == []
