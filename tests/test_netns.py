"""The network-namespace harness (tools/netns.py): hosts reach each other over the bridge; a host
whose link is down vanishes without a reset and comes back when it is up; a delayed host's
packets wait and arrive intact, healed it is as before; nothing is left behind."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import netns_hosts
from tools.netns import FaultUnavailable, Hosts

# Processes on separate network stacks, on the subnet the partition tests use: one at a time.
pytestmark = pytest.mark.multiprocess

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


def _connect_s(hosts: Hosts, to: int, source: int = 1) -> float:
    timed = ("import socket, sys, time\nt = time.monotonic()\n"
             "socket.create_connection((sys.argv[1], 7000), timeout=5).close()\n"
             "print(time.monotonic() - t)\n")
    out = subprocess.run(hosts.command(source, [sys.executable, "-c", timed, hosts.address(to)]),
                         capture_output=True, text=True, timeout=30)
    return float(out.stdout)


def _delay_or_skip(hosts: Hosts, i: int, ms: float) -> None:
    try:
        hosts.delay(i, ms)
    except FaultUnavailable as e:
        assert "/dev/net/tun" in str(e), e
        pytest.skip(str(e))


def _switch_pids(hosts: Hosts) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", hosts.switch], capture_output=True, text=True,
                         timeout=10, check=True).stdout
    return [int(pid) for pid in out.split()]


def _bridge_ports(hosts: Hosts) -> list[str]:
    out = subprocess.run(["ip", "-n", hosts.switch, "-o", "link", "show", "master", "br0"],
                         capture_output=True, text=True, timeout=10, check=True).stdout
    return sorted(line.split(":")[1].strip().split("@")[0] for line in out.splitlines())


def test_a_delay_slows_a_host_s_packets_or_says_why_it_cannot(hosts):
    _serve_on(hosts, 0)
    _delay_or_skip(hosts, 1, 400)
    assert _connect_s(hosts, 0) >= 0.4  # the SYN waits
    assert _connect_s(hosts, 0, source=2) < 0.2  # the other hosts' links are as they were


# Sends argv[2] random bytes to host argv[1]'s port 7001, which sends them back; prints whether
# what came back is what was sent.
_ECHO = ("import socket\n"
         "s = socket.socket(); s.bind(('0.0.0.0', 7001)); s.listen(1); print('ready', flush=True)\n"
         "c = s.accept()[0]\n"
         "while True:\n"
         "    b = c.recv(1 << 16)\n"
         "    if not b: break\n"
         "    c.sendall(b)\n")
_ROUND_TRIP = ("import os, socket, sys, threading\n"
               "data = os.urandom(int(sys.argv[2])); back = bytearray()\n"
               "c = socket.create_connection((sys.argv[1], 7001), timeout=20)\n"
               "def read():\n"
               "    while len(back) < len(data):\n"
               "        back.extend(c.recv(1 << 16))\n"
               "t = threading.Thread(target=read); t.start(); c.sendall(data); t.join()\n"
               "print(bytes(back) == data)\n")


def test_a_delayed_host_s_bulk_data_arrives_intact_and_heal_restores_the_link(hosts):
    echo = hosts.run(0, [sys.executable, "-c", _ECHO], stdout=subprocess.PIPE, text=True)
    assert echo.stdout.readline().strip() == "ready"
    _serve_on(hosts, 0)
    ports = _bridge_ports(hosts)
    _delay_or_skip(hosts, 1, 50)
    assert len(_switch_pids(hosts)) == 1  # the forwarder
    # Large TCP segments and checksums left to the veth cross the forwarder both ways.
    out = subprocess.run(hosts.command(1, [sys.executable, "-c", _ROUND_TRIP, hosts.address(0),
                                           str(4 << 20)]), capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "True", out
    hosts.heal(1)
    assert _switch_pids(hosts) == []
    assert _bridge_ports(hosts) == ports  # the TAP device gone, the port back on the bridge
    assert _connect_s(hosts, 0) < 0.2
    _delay_or_skip(hosts, 1, 50)  # and it can be delayed again
    assert _connect_s(hosts, 0) >= 0.05


def test_close_kills_processes_and_deletes_namespaces():
    hosts = netns_hosts(1)
    with hosts:
        proc = hosts.run(0, [sys.executable, "-c", "import time; time.sleep(600)"])
        names = [*hosts.names, hosts.switch]
        try:
            hosts.delay(0, 10)
            forwarders = _switch_pids(hosts)
        except FaultUnavailable:
            forwarders = []
    assert proc.poll() is not None
    for pid in forwarders:
        assert not os.path.exists(f"/proc/{pid}"), pid
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                            timeout=10).stdout
    assert not any(name in listed for name in names)


def test_bad_count_is_refused():
    with pytest.raises(ValueError, match="1 to 250"):
        Hosts(0)
