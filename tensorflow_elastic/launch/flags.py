"""Command-line flags as torchrun and horovodrun users type them.

torchrun accepts ``--nproc-per-node`` and ``--nproc_per_node`` alike; users
of it type either, so every multi-word flag of our launchers answers to both
spellings. The help shows both; the parsed name is the underscore one.
"""

from __future__ import annotations

import argparse


def spellings(name: str) -> list[str]:
    """``--nproc_per_node`` -> [``--nproc-per-node``, ``--nproc_per_node``]; others unchanged."""
    if not name.startswith("--") or not any(sep in name[2:] for sep in "_-"):
        return [name]
    words = name[2:].replace("-", "_")
    return [f"--{words.replace('_', '-')}", f"--{words}"]


class LauncherArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose long flags take both spellings (see :func:`spellings`)."""

    def add_argument(self, *names: str, **kwargs) -> argparse.Action:
        if names and names[0].startswith("-"):
            spelled: list[str] = []
            for name in names:
                spelled += [s for s in spellings(name) if s not in spelled]
            names = tuple(spelled)
        return super().add_argument(*names, **kwargs)

    def _get_option_tuples(self, option_string: str) -> list[tuple]:
        # An abbreviation (--nproc) matches both spellings of one flag: that is no ambiguity.
        unique: dict[int, tuple] = {}
        for option in super()._get_option_tuples(option_string):
            unique.setdefault(id(option[0]), option)
        return list(unique.values())
