"""Addresses for workers' TensorFlow servers: the node's host, a port no one uses."""

from __future__ import annotations

import socket


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def reserve_port(host: str, port: int = 0) -> socket.socket:
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


class PortAllocator:
    """Gives ``first_port`` to the first worker if it is free, then free ports.

    A restarted worker gets a new port: the orchestrator blocks addresses that
    failed repeatedly, and a fresh address keeps a new node clear of that.
    """

    def __init__(self, host: str, first_port: int = 0):
        self.host = host
        self._next_fixed = first_port or None

    def address(self) -> str:
        """An address whose port is free now, for a worker that binds it itself later."""
        address, held = self.held_address()
        held.close()
        return address

    def held_address(self) -> tuple[str, socket.socket]:
        """An address and the listening socket that holds its port, for a worker to inherit.

        The worker's own hold (``tensorflow_elastic.init()``) starts only after
        its imports, seconds after the agent chose the port; passing the held
        socket leaves no moment in which another process can take the port.
        """
        fixed, self._next_fixed = self._next_fixed, None
        if fixed is not None:
            try:
                held = reserve_port(self.host, fixed)
                return format_address(self.host, fixed), held
            except OSError:
                pass
        held = reserve_port(self.host)
        return format_address(self.host, held.getsockname()[1]), held


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def local_address_towards(endpoint_host: str) -> str:
    """This machine's address on the route to the orchestrator (loopback for a local one)."""
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
