"""Hosts on separate network stacks, for tests and benchmarks of vanished hosts (standard library
only; the tensorflow_elastic package never imports it).

``Hosts(n)`` makes n network namespaces, each with one interface (eth0, 10.77.0.<i+1>/24)
plugged by a veth pair into a bridge that lives in a namespace of its own, so nothing in the
caller's network stack changes. ``link_down(i)`` unplugs host i at the bridge: its peers get no
reset and no error, their packets just stop arriving, as after a power loss or a partition;
``link_up(i)`` plugs it back in. ``drop(i, ...)`` loses a share of host i's packets (all of
them, or those to and from one peer: an asymmetric partition) with iptables; ``delay(i, ms)``
delays the frames it sends with a forwarder of its own (tools/delay_link.py: a packet socket on
its switch port and a TAP device on the bridge, so no kernel module is needed: tc's netem is
missing from many kernels); both raise :class:`FaultUnavailable` where iptables or
/dev/net/tun is missing. ``run(i, argv)`` starts a process on host i. Leaving the
``with`` block (or ``close()``) kills the processes it started, by pid, and deletes the
namespaces, also after a failure.

Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2; otherwise the constructor raises
:class:`NetnsUnavailable`, whose message says why (tests skip with it)::

    from tools.netns import Hosts, NetnsUnavailable
    try:
        hosts = Hosts(3)
    except NetnsUnavailable as e:
        pytest.skip(str(e))
    with hosts:
        proc = hosts.run(0, ["python", "-m", "http.server", "--bind", hosts.address(0)])
        hosts.link_down(0)
"""

from __future__ import annotations

import os
import secrets
import shutil
import select
import signal
import subprocess
import sys
from typing import Any, Sequence

SUBNET_PREFIX = "10.77.0."
_IP_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 10.0
_DELAY_LINK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "delay_link.py")


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no iproute2, a sandbox forbids it)."""


class FaultUnavailable(RuntimeError):
    """A network fault cannot be made here (iptables missing, a kernel without netem)."""


class Hosts:
    """``count`` namespaces on one bridge; host i has address ``10.77.0.<i+1>``."""

    def __init__(self, count: int):
        if not 1 <= count <= 250:
            raise ValueError(f"need 1 to 250 hosts, got {count}")
        if shutil.which("ip") is None:
            raise NetnsUnavailable("network namespaces need iproute2's `ip` command, not found")
        if os.geteuid() != 0:
            raise NetnsUnavailable("network namespaces need root (ip netns add); run as root")
        tag = secrets.token_hex(3)
        self.names = [f"tfe-{tag}-h{i}" for i in range(count)]
        self.switch = f"tfe-{tag}-sw"  # the bridge's namespace
        self._procs: list[subprocess.Popen] = []
        self._delays: dict[int, subprocess.Popen] = {}  # host -> its delay_link forwarder
        self._made: list[str] = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        try:
            _ip("netns", "add", self.switch)
        except subprocess.CalledProcessError as e:
            raise NetnsUnavailable(f"`ip netns add` is not permitted here: "
                                   f"{e.stderr.strip() or e}") from None
        self._made.append(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, name in enumerate(self.names):
            _ip("netns", "add", name)
            self._made.append(name)
            port = self._port(i)
            _ip("link", "add", "eth0", "netns", name, "type", "veth",
                "peer", "name", port, "netns", self.switch)
            _ip("-n", self.switch, "link", "set", port, "master", "br0")
            _ip("-n", self.switch, "link", "set", port, "up")
            _ip("-n", name, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            _ip("-n", name, "link", "set", "lo", "up")

    def __enter__(self) -> "Hosts":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self.names)

    @staticmethod
    def address(i: int) -> str:
        """Host i's IPv4 address."""
        return f"{SUBNET_PREFIX}{i + 1}"

    @staticmethod
    def _port(i: int) -> str:
        return f"p{i}"

    def command(self, i: int, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run on host i (for callers that start processes their own way)."""
        return ["ip", "netns", "exec", self.names[i], *argv]

    def run(self, i: int, argv: Sequence[str], **popen: Any) -> subprocess.Popen:
        """Starts ``argv`` on host i (keyword arguments go to Popen); killed at close().

        ``ip netns exec`` replaces itself with ``argv``, so the pid is the program's.
        """
        proc = subprocess.Popen(self.command(i, argv), **popen)
        self._procs.append(proc)
        return proc

    def link_down(self, i: int) -> None:
        """Unplugs host i at the bridge: nothing reaches it or leaves it, and nobody is told."""
        _ip("-n", self.switch, "link", "set", self._port(i), "down")

    def link_up(self, i: int) -> None:
        """Plugs host i back in; its connections resume where TCP's retransmissions left them."""
        _ip("-n", self.switch, "link", "set", self._port(i), "up")

    def drop(self, i: int, probability: float = 1.0, peer: int | None = None) -> None:
        """Host i loses `probability` of the packets it sends and receives (only those to and
        from host `peer`, when given); `heal(i)` ends it."""
        if shutil.which("iptables") is None:
            raise FaultUnavailable("packet loss needs iptables (Debian package iptables)")
        match = ["-m", "statistic", "--mode", "random", "--probability", f"{probability:.4f}"]
        for chain, direction in (("INPUT", "-s"), ("OUTPUT", "-d")):
            where = [] if peer is None else [direction, self.address(peer)]
            self._in(i, "iptables", "-A", chain, *where, *match, "-j", "DROP")

    def delay(self, i: int, ms: float) -> None:
        """Host i's outgoing frames wait `ms` (its incoming ones do not); `heal(i)` ends it.

        Host i's switch port leaves the bridge for a forwarder (tools/delay_link.py, started
        here and ended by pid at heal or close) that passes its frames on through a TAP device
        on the bridge; connections stay up.
        """
        if not os.path.exists("/dev/net/tun"):
            raise FaultUnavailable("delays need /dev/net/tun (TAP devices)")
        if i in self._delays:
            raise ValueError(f"host {i} is delayed already: heal({i}) first")
        tap = f"d{i}"
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.switch, sys.executable, _DELAY_LINK,
             "--port", self._port(i), "--tap", tap, "--delay_ms", str(ms)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._procs.append(proc)
        self._delays[i] = proc
        if (not select.select([proc.stdout], [], [], _IP_TIMEOUT_S)[0]
                or proc.stdout.readline().strip() != "ready"):
            self._end_delay(i)
            raise FaultUnavailable(f"the delaying forwarder did not start: "
                                   f"{proc.stderr.read().strip()[-500:]}")
        _ip("-n", self.switch, "link", "set", tap, "master", "br0")
        _ip("-n", self.switch, "link", "set", tap, "up")
        _ip("-n", self.switch, "link", "set", self._port(i), "nomaster")

    def heal(self, i: int) -> None:
        """Ends host i's drops and delays (a delay's frames still held are sent at once)."""
        if shutil.which("iptables") is not None:
            self._in(i, "iptables", "-F")
        if i in self._delays:  # back on the bridge before the forwarder goes: nothing lost
            _ip("-n", self.switch, "link", "set", self._port(i), "master", "br0")
            self._end_delay(i)

    def _end_delay(self, i: int) -> None:
        proc = self._delays.pop(i)
        proc.stdin.close()  # the forwarder's cue: send what it holds, then exit
        try:
            proc.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=_STOP_TIMEOUT_S)

    def _in(self, i: int, *argv: str) -> None:
        done = subprocess.run(self.command(i, argv), capture_output=True, text=True,
                              timeout=_IP_TIMEOUT_S)
        if done.returncode != 0:
            raise FaultUnavailable(f"`{' '.join(argv)}` failed: {done.stderr.strip()}")

    def close(self) -> None:
        """Kills the processes started here (SIGCONT first, for stopped ones), then deletes the
        namespaces; safe to call twice."""
        for proc in self._procs:
            if proc.poll() is None:
                for sig in (signal.SIGKILL, signal.SIGCONT):
                    try:
                        os.kill(proc.pid, sig)
                    except ProcessLookupError:
                        break
            try:
                proc.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()
        self._delays.clear()
        for name in reversed(self._made):
            try:
                _ip("netns", "del", name)
            except subprocess.CalledProcessError:
                pass
        self._made.clear()


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True,
                   timeout=_IP_TIMEOUT_S)
