"""The one rule for addresses, and the environment's typed readers."""

import asyncio
import errno
import socket
import time

import pytest

from tensorflow_elastic import environment, net


@pytest.mark.parametrize("text, expected", [
    ("127.0.0.1:29400", ("127.0.0.1", 29400)),
    ("[::1]:80", ("::1", 80)),
    ("host.example:1", ("host.example", 1)),
])
def test_addresses_parse(text, expected):
    assert net.parse_address(text) == expected


@pytest.mark.parametrize("text", ["nohost", ":80", "h:", "h:x", "h:65536", "h:0",
                                  "h:" + "9" * 100_000])
def test_bad_addresses_say_what_is_expected_without_echoing_a_huge_input(text):
    with pytest.raises(net.AddressError, match="expected HOST:PORT") as e:
        net.parse_address(text)
    assert len(str(e.value)) < 200


def test_port_zero_is_allowed_only_where_asked():
    assert net.parse_address("127.0.0.1:0", allow_port_zero=True) == ("127.0.0.1", 0)


def test_format_brackets_ipv6():
    assert net.format_address("::1", 5) == "[::1]:5" and net.format_address("h", 5) == "h:5"


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.1.2.3", True),
                                            ("::1", True), ("localhost", True),
                                            ("0.0.0.0", False), ("10.0.0.5", False)])
def test_loopback(host, loopback):
    assert net.is_loopback(host) is loopback


def test_a_held_port_cannot_be_taken_until_released():
    held = net.hold_port("127.0.0.1")
    port = held.getsockname()[1]
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", port))
    held.close()


def test_typed_environment_readers_name_the_variable(monkeypatch):
    monkeypatch.setenv(environment.JOIN_TIMEOUT, "soon")
    monkeypatch.setenv(environment.MIN_NODES, "3")
    monkeypatch.delenv(environment.MAX_NODES, raising=False)
    with pytest.raises(ValueError, match=r"\$TFE_JOIN_TIMEOUT='soon' is not a number"):
        environment.number(environment.JOIN_TIMEOUT, 1.0)
    assert environment.integer(environment.MIN_NODES, 1) == 3
    assert environment.integer(environment.MAX_NODES, 7) == 7


def _probe(address: str, timeout: float = 1.0) -> net.Probe:
    return asyncio.run(net.probe(address, timeout))


def test_a_listening_peer_is_alive_and_a_closed_port_is_dead():
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        assert _probe(f"127.0.0.1:{listening.getsockname()[1]}") is net.Probe.ALIVE
    with socket.socket() as bound:  # bound, never listening: connections are refused
        bound.bind(("127.0.0.1", 0))
        assert _probe(f"127.0.0.1:{bound.getsockname()[1]}") is net.Probe.DEAD


@pytest.mark.parametrize("error", [OSError(errno.EMFILE, "Too many open files"),
                                   OSError(errno.ENOBUFS, "No buffer space available"),
                                   socket.gaierror(socket.EAI_NONAME, "Name does not resolve")])
def test_a_local_failure_says_nothing_of_the_peer(monkeypatch, error):
    async def fails(host, port):
        raise error

    monkeypatch.setattr(asyncio, "open_connection", fails)
    assert _probe("127.0.0.1:9") is net.Probe.UNKNOWN


def test_a_timeout_is_death_only_when_the_prober_kept_up(monkeypatch):
    async def silent(host, port):
        await asyncio.sleep(60)

    monkeypatch.setattr(asyncio, "open_connection", silent)
    assert _probe("127.0.0.1:9", timeout=0.1) is net.Probe.DEAD

    async def stalled_prober():
        asyncio.get_running_loop().call_soon(time.sleep, 0.3)  # the loop stalls past the timeout
        return await net.probe("127.0.0.1:9", 0.1)

    assert asyncio.run(stalled_prober()) is net.Probe.UNKNOWN
