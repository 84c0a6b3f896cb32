"""Fixtures for the orchestrator tests: groups of light nodes (clients) of one run.

The orchestrator processes themselves come from tests/conftest.py.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator

import pytest

from tensorflow_elastic.rendezvous import Client, Membership

HEARTBEAT_INTERVAL_S = 0.3
# Node addresses: nothing listens there, so a reported node fails its probe.
FIRST_NODE_PORT = 20000
# No orchestrator test may hang a CI run (needs pytest-timeout, in requirements.txt).
TEST_TIMEOUT_S = 120


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.path).startswith(here) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_S))


class Nodes:
    """Clients of one run; joins them concurrently (a blocked join needs its own thread)."""

    def __init__(self, endpoint: str, run_id: str = "job", **client_kwargs: object):
        self.endpoint = endpoint
        self.run_id = run_id
        self.client_kwargs = client_kwargs
        self.clients: list[Client] = []
        self._pool = ThreadPoolExecutor(max_workers=64)

    def client(self) -> Client:
        c = Client(self.endpoint, self.run_id, retry_timeout=20.0, **self.client_kwargs)
        self.clients.append(c)
        return c

    def join_async(self, count: int, min_nodes: int, max_nodes: int, timeout: float = 30.0,
                   heartbeat: float | None = HEARTBEAT_INTERVAL_S):
        """Starts ``count`` new nodes joining; returns (clients, futures of memberships).

        A node that got in heartbeats every ``heartbeat`` seconds (None: never).
        """
        def join(c: Client, port: int) -> Membership:
            m = c.join(f"127.0.0.1:{port}", min_nodes, max_nodes, timeout)
            if heartbeat is not None:
                c.start_heartbeats(heartbeat)
            return m

        clients = [self.client() for _ in range(count)]
        futures = [self._pool.submit(join, c, FIRST_NODE_PORT + len(self.clients) + i)
                   for i, c in enumerate(clients)]
        return clients, futures

    def join(self, count: int, min_nodes: int, max_nodes: int, timeout: float = 30.0,
             heartbeat: float | None = HEARTBEAT_INTERVAL_S) -> list[tuple[Client, Membership]]:
        clients, futures = self.join_async(count, min_nodes, max_nodes, timeout, heartbeat)
        return [(c, f.result(timeout=timeout + 10)) for c, f in zip(clients, futures)]

    def submit(self, fn: Callable, *args: object):
        return self._pool.submit(fn, *args)

    def close(self) -> None:
        for c in self.clients:
            c.close()
        self._pool.shutdown(wait=False, cancel_futures=True)


@pytest.fixture
def nodes_for() -> Iterator[Callable[..., Nodes]]:
    made: list[Nodes] = []

    def make(endpoint: str, run_id: str = "job", **kwargs: object) -> Nodes:
        n = Nodes(endpoint, run_id, **kwargs)
        made.append(n)
        return n

    yield make
    for n in made:
        n.close()




class CallContext:
    """What a Join or JoinMany handler uses of a gRPC context: the callbacks for the call's
    end."""

    def __init__(self) -> None:
        self.done: list = []

    def add_done_callback(self, callback) -> None:
        self.done.append(callback)
