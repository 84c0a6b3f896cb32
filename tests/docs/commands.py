"""The package's command-line parsers, and the command lines the docs write with them."""

from __future__ import annotations

import argparse
import re
import shlex
from typing import Iterator

from tensorflow_elastic import cli as tfelastic_cli
from tensorflow_elastic.launch import launcher, tensorflowrun
from tensorflow_elastic.launch.discovery import kubernetes, slurm
from tensorflow_elastic.rendezvous import cli as orchestrator_cli

from tests import doc_commands
from tests.docs import markdown

# How the docs call each command, and whether the command's first positional argument ends its
# own flags (a launcher: what follows is the training script's).
PARSERS = {
    "tfelastic-run": (launcher.build_parser, True),
    "python -m tensorflow_elastic.distributed.launch": (launcher.build_parser, True),
    "tensorflowrun": (tensorflowrun.build_parser, True),
    "tfelastic-orchestrator": (orchestrator_cli.build_parser, False),
    "python -m tensorflow_elastic.rendezvous": (orchestrator_cli.build_parser, False),
    "tfelastic": (tfelastic_cli.build_parser, False),
    "python -m tensorflow_elastic.launch.discovery.slurm": (slurm.build_parser, False),
    "python -m tensorflow_elastic.launch.discovery.kubernetes": (kubernetes.build_parser, False),
}
_FLAG = re.compile(r"^--?[A-Za-z][\w-]*(=.*)?$")
_SHELL_SUBSTITUTION = re.compile(r"\$\([^)]*\)")
_INLINE_CODE = re.compile(r"`([^`]+)`")


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every parser by command, subcommands of ``tfelastic`` as ``tfelastic status`` etc."""
    found = {}
    for command, (build, _) in PARSERS.items():
        if command.startswith("python -m") and command.replace("python -m ", "") in \
                {"tensorflow_elastic.distributed.launch", "tensorflow_elastic.rendezvous"}:
            continue   # the same parsers as the console scripts
        parser = build()
        found[command] = parser
        for sub in _subparsers(parser):
            found.update({f"{command} {name}": p for name, p in sub.choices.items()})
    return found


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse._SubParsersAction]:
    return [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings
            and not isinstance(a, (argparse._HelpAction, argparse._VersionAction))]


def command_lines(path: str) -> Iterator[str]:
    """Every line of fenced blocks (continuations joined) and every inline code span of a page."""
    text = markdown.read(path)
    for block in doc_commands.blocks(path):
        yield from doc_commands.command_lines(block.text)
    for line in markdown.prose_lines(text):
        yield from _INLINE_CODE.findall(line)


def unknown_flags(line: str) -> list[str]:
    """The flags a command line gives one of the package's commands that its parser lacks."""
    words = _words(line)
    unknown = []
    for start in range(len(words)):
        for command, (build, script_ends_flags) in PARSERS.items():
            length = len(command.split())
            if [w.removeprefix(".venv/bin/") for w in words[start:start + length]] == \
                    command.split():
                unknown += _check(build(), words[start + length:], script_ends_flags, command)
    return unknown


def _words(line: str) -> list[str]:
    line = _SHELL_SUBSTITUTION.sub("SUBSTITUTED", line)
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        words = line.split()
    # "python3 -m x" and ".venv/bin/python -m x" call the same command as "python -m x".
    return ["python" if re.fullmatch(r"(\S*/)?python3?", w) else w for w in words]


def _check(parser: argparse.ArgumentParser, words: list[str], script_ends_flags: bool,
           command: str) -> list[str]:
    unknown, index = [], 0
    while index < len(words):
        word = words[index]
        index += 1
        if word in ("|", "&&", ";", "||", ">", "2>&1") or word.startswith(("#", ">")):
            break
        if word == "--":
            break
        if not _FLAG.match(word):
            sub = [s for s in _subparsers(parser) if word in s.choices]
            if sub:
                parser = sub[0].choices[word]
                command = f"{command} {word}"
                continue
            if script_ends_flags:
                break
            continue
        name = word.split("=", 1)[0]
        action = parser._option_string_actions.get(name)
        if action is None:
            unknown.append(f"{command} {name}")
            continue
        takes_value = action.nargs != 0
        if takes_value and "=" not in word and index < len(words) and \
                not (action.nargs == "?" and _FLAG.match(words[index])):
            index += 1
    return unknown
