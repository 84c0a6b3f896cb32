"""Addresses: HOST:PORT parsing, ports held for a worker's server, reachability.

Kept free of TensorFlow and gRPC so the orchestrator, the launcher and the
workers share one rule for what an address is.
"""

from __future__ import annotations

import asyncio
import enum
import ipaddress
import socket

# A port has at most 5 digits; a longer string is rejected before int() reads it.
_MAX_PORT_DIGITS = 5


class AddressError(ValueError):
    """A string that is not HOST:PORT."""


def parse_address(value: str, allow_port_zero: bool = False) -> tuple[str, int]:
    """'HOST:PORT' or '[IPv6]:PORT' -> (host, port), with an error that shows the expected form."""
    host, sep, port = value.rpartition(":")
    lowest = 0 if allow_port_zero else 1
    if (not sep or not host or not port.isdigit() or len(port) > _MAX_PORT_DIGITS
            or not lowest <= int(port) <= 65535):
        raise AddressError(f"expected HOST:PORT (e.g. 127.0.0.1:29400), got {_shorten(value)!r}")
    return host.strip("[]"), int(port)


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _shorten(value: str, limit: int = 80) -> str:
    return value if len(value) <= limit else f"{value[:limit]}... ({len(value)} characters)"


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (127.0.0.0/8, ::1, localhost)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def is_wildcard(host: str) -> bool:
    """Whether ``host`` means every interface (0.0.0.0, ::): an address to listen on that no
    one can be told to connect to."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return host == ""


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def hold_port(host: str, port: int = 0) -> socket.socket:
    """A listening socket on ``port`` (0: a free one), to close right before the worker's
    TensorFlow server binds the port.

    A port that was only checked free can be taken by any connection's
    ephemeral port in the seconds before TensorFlow binds it (the server then
    fails with "Could not start gRPC server"). Held open, it cannot; and probes
    of the node's address find it alive while it starts. Bound on every
    interface, as TensorFlow's server is. Raises OSError if the port is in use.
    """
    family = _family(host)
    s = socket.socket(family)
    try:
        s.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
        s.listen()
    except OSError:
        s.close()
        raise
    return s


def inherit_held_port(fd_text: str | None, port: int) -> socket.socket | None:
    """The listening socket a parent passed down as file descriptor ``fd_text``, if it holds ``port``.

    The socket is made non-inheritable (this process's own children must not
    keep the port); one that holds another port is closed.
    """
    if fd_text is None:
        return None
    try:
        held = socket.socket(fileno=int(fd_text))
    except (ValueError, OSError):
        return None
    held.set_inheritable(False)
    if held.getsockname()[1] != port:
        held.close()
        return None
    return held


def local_address_towards(endpoint_host: str) -> str:
    """This machine's address on the route to ``endpoint_host`` (loopback for a local one)."""
    try:
        infos = socket.getaddrinfo(endpoint_host, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror:
        return "127.0.0.1"
    family, _, _, _, sockaddr = infos[0]
    if family == socket.AF_INET and sockaddr[0].startswith("127."):
        return "127.0.0.1"
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((sockaddr[0], 9))  # UDP connect sends nothing; it only picks a route
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


class Probe(enum.Enum):
    """What a connection attempt says of a peer."""

    ALIVE = "alive"      # something accepted the connection
    DEAD = "dead"        # refused, or no answer within the timeout while this process kept up
    UNKNOWN = "unknown"  # a local failure (no file descriptors, no buffers, a name that does
                         # not resolve) or a timeout this process's own stall may explain


# A probe's timer that fires this much later than asked means the prober itself was stalled
# (a busy event loop, a GC pause): its timeout says nothing about the peer.
STALL_TOLERANCE = 0.5


async def probe(address: str, timeout: float) -> Probe:
    """Tries a TCP connection to ``address`` for ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        host, port = parse_address(address)
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except ConnectionRefusedError:
        return Probe.DEAD
    except asyncio.TimeoutError:
        late = loop.time() - started - timeout
        return Probe.UNKNOWN if late > STALL_TOLERANCE * timeout else Probe.DEAD
    except (OSError, ValueError):
        return Probe.UNKNOWN
    writer.close()
    return Probe.ALIVE


__all__ = ["AddressError", "format_address", "hold_port", "inherit_held_port",
           "local_address_towards", "parse_address", "Probe", "probe"]
