"""A burst of concurrent calls: whatever the orchestrator sheds, every client call gets through."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from tensorflow_elastic.rendezvous import Client

CLIENTS = 3
CALLS_PER_CLIENT = 300


def test_every_status_call_of_a_burst_succeeds(orchestrator):
    clients = [Client(orchestrator.endpoint, "job", retry_timeout=60.0) for _ in range(CLIENTS)]
    try:
        clients[0].join("127.0.0.1:20001", 1, 1, timeout=30)
        with ThreadPoolExecutor(CLIENTS * CALLS_PER_CLIENT) as pool:
            replies = list(pool.map(lambda c: c.status(), clients * CALLS_PER_CLIENT))
    finally:
        for c in clients:
            c.close()
    assert len(replies) == CLIENTS * CALLS_PER_CLIENT
    assert all([r.run_id for r in runs] == ["job"] for runs in replies)
    assert orchestrator.proc.poll() is None
