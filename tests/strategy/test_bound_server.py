"""A worker's TensorFlow server listens on the worker's own address only: it takes no
credentials, so it must not be reachable on the host's other networks."""

from __future__ import annotations

import fcntl
import socket
import struct
import subprocess
import sys
import textwrap

import pytest

from tensorflow_elastic.strategy import cluster
from tests.launch.conftest import free_port

_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address

_SERVER = textwrap.dedent("""
    import sys, time
    from tensorflow_elastic.strategy import cluster
    members = {0: sys.argv[1], 1: "127.0.0.1:1"}
    cluster.configure(0)
    cluster.start(members, 0)
    cluster.update(members, 0)  # a membership change keeps the server where it listens
    print("serving", flush=True)
    time.sleep(60)
""")


def _other_address() -> str | None:
    """An IPv4 address of one of this host's interfaces that is not loopback (None: none)."""
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR,
                                     struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address
        address = socket.inet_ntoa(packed[20:24])
        if not address.startswith("127."):
            return address
    return None


def _accepts(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
        return True
    except OSError:
        return False


def test_an_ip_address_gets_the_bound_server_and_a_name_tensorflow_s_own():
    assert cluster.server_def({0: "10.0.0.7:2222"}, 0).protocol == cluster.BOUND_PROTOCOL
    assert cluster.server_def({0: "[::1]:2222"}, 0).protocol == cluster.BOUND_PROTOCOL
    assert cluster.server_def({0: "worker-0.jobs:2222"}, 0).protocol == "grpc"


@pytest.mark.multiprocess
def test_the_server_is_not_reachable_on_another_address_of_the_host():
    other = _other_address()
    if other is None:
        pytest.skip("this host has no address besides loopback to try the server on")
    port = free_port()
    worker = subprocess.Popen([sys.executable, "-c", _SERVER, f"127.0.0.1:{port}"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output = []
        for line in worker.stdout:
            output.append(line)
            if line.startswith("serving"):
                break
        assert worker.poll() is None, "".join(output[-20:])
        assert _accepts("127.0.0.1", port)
        assert not _accepts(other, port), f"the server answers on {other} too"
    finally:
        worker.kill()
        worker.wait()
