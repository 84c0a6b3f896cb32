"""Which hosts a multi-host job may use now: a hostfile, a discovery script, and a cooldown.

A discovery script prints the hosts available right now, one ``host:slots``
line each (slots: worker processes the host runs); it is run again and again,
so spot machines appear and vanish. A hostfile lists fixed hosts the same way
(``host slots=N`` and ``host`` are accepted too). A host whose agent failed
waits out a cooldown that doubles with each failure, so a broken machine is
not restarted in a tight loop.
"""

from __future__ import annotations

import dataclasses
import re
import socket
import subprocess
import time

DISCOVERY_TIMEOUT_S = 30.0

_LINE = re.compile(r"^\s*(?P<host>\[[^\]]+\]|[^\s:]+)\s*(?::\s*(?P<slots>\d+)|slots\s*=\s*(?P<kv>\d+))?\s*$")


def parse_hosts(text: str, source: str) -> dict[str, int]:
    """``host:slots`` lines (blank lines and # comments skipped) -> {host: slots}."""
    hosts: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _LINE.match(line)
        if match is None:
            raise ValueError(f"{source}, line {number}: expected 'host:slots', got {raw.strip()!r}")
        slots = int(match.group("slots") or match.group("kv") or 1)
        if slots < 1:
            raise ValueError(f"{source}, line {number}: slots must be >= 1, got {slots}")
        hosts[match.group("host").strip("[]")] = slots
    return hosts


def read_hostfile(path: str) -> dict[str, int]:
    with open(path, encoding="utf-8") as f:
        return parse_hosts(f.read(), path)


def run_discovery(script: str, timeout: float = DISCOVERY_TIMEOUT_S) -> dict[str, int]:
    """Runs the discovery script once; raises RuntimeError with its stderr if it fails."""
    try:
        result = subprocess.run([script], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"discovery script {script} did not run: {e}") from None
    if result.returncode != 0:
        raise RuntimeError(f"discovery script {script} exited with {result.returncode}: "
                           f"{result.stderr.strip()[-500:]}")
    return parse_hosts(result.stdout, f"output of {script}")


def is_local(host: str) -> bool:
    """True for this machine's names and loopback addresses (started without ssh)."""
    if host in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except socket.gaierror:
        return False
    return all(a.startswith("127.") or a == "::1" for a in addresses)


@dataclasses.dataclass
class Cooldown:
    """Failures per host and until when each is left alone."""

    base_s: float
    max_s: float
    _failures: dict[str, int] = dataclasses.field(default_factory=dict)
    _until: dict[str, float] = dataclasses.field(default_factory=dict)

    def record_failure(self, host: str) -> float:
        """Puts ``host`` on cooldown; returns how long it lasts."""
        count = self._failures.get(host, 0) + 1
        self._failures[host] = count
        seconds = min(self.max_s, self.base_s * 2 ** (count - 1))
        self._until[host] = time.monotonic() + seconds
        return seconds

    def cooling(self, host: str) -> bool:
        return time.monotonic() < self._until.get(host, 0.0)
