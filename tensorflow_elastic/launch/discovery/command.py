"""What the discovery scripts share: running a cluster tool, printing hosts, failing clearly.

A discovery script that fails must say why on stderr and exit non-zero:
``tensorflowrun`` then logs the message and keeps the hosts it found last
time, instead of stopping every agent on an empty answer.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from typing import Callable, Sequence

TOOL_TIMEOUT_S = 20.0


class DiscoveryError(Exception):
    """A reason the available hosts could not be found; printed without a traceback."""


def run_tool(argv: Sequence[str], timeout: float = TOOL_TIMEOUT_S) -> str:
    """Runs a cluster tool (kubectl, scontrol) and returns its stdout; DiscoveryError otherwise."""
    if shutil.which(argv[0]) is None:
        raise DiscoveryError(f"{argv[0]} not found: install it or put it on PATH")
    try:
        result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise DiscoveryError(f"{argv[0]} did not answer within {timeout:g} s") from None
    except OSError as e:
        raise DiscoveryError(f"{argv[0]} did not run: {e}") from None
    if result.returncode != 0:
        raise DiscoveryError(f"{' '.join(argv[:3])} exited with {result.returncode}: "
                             f"{result.stderr.strip()[-500:]}")
    return result.stdout


def slot_count(text: str) -> int:
    """argparse type for --slots: worker processes per host, at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def format_hosts(hosts: Sequence[str], slots: int) -> str:
    """The lines ``tensorflowrun`` reads: ``host:slots``, IPv6 addresses in brackets."""
    return "".join(f"[{h}]:{slots}\n" if ":" in h else f"{h}:{slots}\n" for h in hosts)


def run_main(prog: str, find_hosts: Callable[[], list[str]], slots: int) -> int:
    """Prints the hosts ``find_hosts`` returns; an error or no host is a message and exit 1."""
    try:
        hosts = find_hosts()
    except DiscoveryError as e:
        print(f"{prog}: error: {e}", file=sys.stderr, flush=True)
        return 1
    sys.stdout.write(format_hosts(hosts, slots))
    return 0
