"""Runs at the sizes users train, on orchestrator replicas sharing a real etcd: 16 members
check the layout of 2,000 variables and exchange values up to the limit each; every save
fits etcd's request limit, and a replica taking over loads it all."""

from __future__ import annotations

import concurrent.futures
import os

import pytest

from tensorflow_elastic.errors import GenerationEnded, StateLayoutMismatch
from tensorflow_elastic.rendezvous import Client, Orchestrator
from tensorflow_elastic.rendezvous.settings import RunSettings
from tensorflow_elastic.training import layouts
from tests.conftest import wait_until
from tests.training.test_layouts import MEMBERS, _big_layout, _Member

# A real etcd on a port chosen before it starts: no other test process beside it.
pytestmark = pytest.mark.serial

# Clients without heartbeats: a timeout no loaded machine reaches.
SETTINGS = RunSettings(heartbeat_timeout=120, last_call=0)


@pytest.mark.timeout(300)
def test_sixteen_members_two_thousand_variables_and_full_values_on_etcd(etcd_server):
    replicas = [Orchestrator("127.0.0.1", 0, store=etcd_server.url, leader_ttl=2,
                             settings=SETTINGS).start() for _ in range(2)]
    endpoints = ",".join(r.endpoint for r in replicas)
    clients = [Client(endpoints, "job", retry_timeout=60) for _ in range(MEMBERS)]
    layout = _big_layout()
    other = layout[:1000] + [(layout[1000][0], (768, 1), "float32")] + layout[1001:]
    values = {c: os.urandom(SETTINGS.max_value_bytes) for c in clients}  # do not compress
    try:
        with concurrent.futures.ThreadPoolExecutor(MEMBERS) as pool:
            joins = [pool.submit(c.join, f"127.0.0.1:{21300 + i}", MEMBERS, MEMBERS, timeout=90)
                     for i, c in enumerate(clients)]
            generation = max(join.result(timeout=120).generation for join in joins)
            members = [_Member(c, generation) for c in clients]
            source, odd = min(m.node_id for m in members), max(m.node_id for m in members)
            checks = [pool.submit(layouts.check, m, other if m.node_id == odd else layout,
                                  source) for m in members]
            outcomes = [_outcome(check) for check in checks]
            assert sorted(map(type, outcomes), key=str) == sorted(
                [StateLayoutMismatch] + [GenerationEnded] * (MEMBERS - 1), key=str)
            # Two exchanges of a full value from every member: about 2.7 MiB to save.
            for name in ("state-a", "state-b"):
                results = [pool.submit(c.synchronize, name, values[c], 90) for c in clients]
                for result in results:
                    assert sorted(result.result(timeout=120).values()) == sorted(values.values())
            leader = next(r for r in replicas if r.endpoint == clients[0].current_endpoint)
            leader.stop()  # the other replica takes over from what etcd holds
            retried = [pool.submit(c.synchronize, "state-b", values[c], 90) for c in clients]
            for result in retried:  # answered from the saved result, no one waits
                assert sorted(result.result(timeout=120).values()) == sorted(values.values())
        wait_until(lambda: clients[0].current_endpoint != leader.endpoint, timeout=5,
                   what="the clients to move to the new leader")
    finally:
        for c in clients:
            c.close()
        for r in replicas:
            r.stop()


def _outcome(check: concurrent.futures.Future) -> object:
    try:
        check.result(timeout=120)
    except (GenerationEnded, StateLayoutMismatch) as e:
        return e
    return None
