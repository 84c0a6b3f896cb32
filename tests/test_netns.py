"""The network-namespace harness (tools/netns.py): hosts reach each other over the bridge; a host
whose link is down vanishes without a reset and comes back when it is up; nothing is left behind."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import netns_hosts
from tools.netns import FaultUnavailable, Hosts

# Connects to host 0's port 7000 with a 1 s timeout; prints "ok" or the error's class name.
_CONNECT = ("import socket, sys\n"
            "try:\n"
            "    socket.create_connection((sys.argv[1], 7000), timeout=1.0).close(); print('ok')\n"
            "except OSError as e:\n"
            "    print(type(e).__name__)\n")
_SERVE = ("import socket, time\n"
          "s = socket.socket(); s.bind(('0.0.0.0', 7000)); s.listen(8); print('ready', flush=True)\n"
          "while True: s.accept()[0].close()\n")


@pytest.fixture
def hosts():
    with netns_hosts(3) as made:
        yield made


def _connect(hosts: Hosts, to: int, source: int = 1) -> str:
    out = subprocess.run(hosts.command(source, [sys.executable, "-c", _CONNECT, hosts.address(to)]),
                         capture_output=True, text=True, timeout=30)
    return out.stdout.strip()


def test_link_down_vanishes_without_reset_and_link_up_returns(hosts):
    server = hosts.run(0, [sys.executable, "-c", _SERVE], stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "ready"
    assert _connect(hosts, 0) == "ok"
    hosts.link_down(0)
    assert _connect(hosts, 0) == "TimeoutError"  # no reset: the peer just stops answering
    hosts.link_up(0)
    assert _connect(hosts, 0) == "ok"


def _serve_on(hosts: Hosts, i: int) -> None:
    server = hosts.run(i, [sys.executable, "-c", _SERVE], stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "ready"


def test_a_partition_from_one_peer_leaves_the_others_reachable(hosts):
    _serve_on(hosts, 0)
    _serve_on(hosts, 2)
    try:
        hosts.drop(1, peer=0)
    except FaultUnavailable as e:
        pytest.skip(str(e))
    assert _connect(hosts, 0) == "TimeoutError"
    assert _connect(hosts, 2) == "ok"
    assert _connect(hosts, 0, source=2) == "ok"
    hosts.heal(1)
    assert _connect(hosts, 0) == "ok"


def test_a_delay_slows_a_host_s_packets_or_says_why_it_cannot(hosts):
    _serve_on(hosts, 0)
    try:
        hosts.delay(1, 400)
    except FaultUnavailable as e:
        assert "netem" in str(e) or "qdisc" in str(e), e
        pytest.skip(str(e))
    timed = ("import socket, sys, time\nt = time.monotonic()\n"
             "socket.create_connection((sys.argv[1], 7000), timeout=5).close()\n"
             "print(time.monotonic() - t)\n")
    out = subprocess.run(hosts.command(1, [sys.executable, "-c", timed, hosts.address(0)]),
                         capture_output=True, text=True, timeout=30)
    assert float(out.stdout) >= 0.4, out


def test_close_kills_processes_and_deletes_namespaces():
    hosts = netns_hosts(1)
    with hosts:
        proc = hosts.run(0, [sys.executable, "-c", "import time; time.sleep(600)"])
        names = list(hosts.names)
    assert proc.poll() is not None
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                            timeout=10).stdout
    assert not any(name in listed for name in names)


def test_bad_count_is_refused():
    with pytest.raises(ValueError, match="1 to 250"):
        Hosts(0)
