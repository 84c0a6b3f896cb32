"""Addresses for workers' TensorFlow servers: the node's host, a port no one uses."""

from __future__ import annotations

import socket

from tensorflow_elastic.net import format_address, hold_port


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
                held = hold_port(self.host, fixed)
                return format_address(self.host, fixed), held
            except OSError:
                pass
        held = hold_port(self.host)
        return format_address(self.host, held.getsockname()[1]), held
