"""docs/ha.md's orchestrator replicas on etcd, run as written (tests/doc_commands.py registers
them): two replicas on one etcd (here on one machine, each with a port of its own), a job of two
launchers that get both, and the status from both."""

from __future__ import annotations

import pytest

from tests.doc_commands import registered

pytestmark = pytest.mark.multiprocess


def test_two_replicas_on_etcd(shell, two_machines, port, tmp_path, etcd_server):
    # etcd itself: the etcd_server fixture, with its own data directory and ports for "...".
    _etcd, replica, launcher, status = registered("test_two_replicas_on_etcd")
    token = tmp_path / "token"
    token.write_text("a-shared-token\n")
    shared = {"/shared/token": str(token), "train.py": "examples/custom_loop.py",
              "etcd1:2379,etcd2:2379,etcd3:2379": etcd_server.endpoint}
    ports = [str(port()), str(port())]
    replicas = [shell(replica, {**shared, "29400": p}) for p in ports]
    for server in replicas:
        server.wait_for(r"listening on")
    endpoints = {**shared, "orch1:29400": f"127.0.0.1:{ports[0]}",
                 "orch2:29400": f"127.0.0.1:{ports[1]}"}
    two_machines(launcher, status, endpoints)
