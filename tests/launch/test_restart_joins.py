"""Restart mode's agent joins the nodes of all its workers in one call (JoinMany)."""

from __future__ import annotations

import collections
import threading

from tensorflow_elastic.launch.restart import RestartElasticity
from tensorflow_elastic.launch.spec import WorkerSpec
from tensorflow_elastic.rendezvous.server import Orchestrator
from tensorflow_elastic.rendezvous.service import RendezvousService
from tensorflow_elastic.rendezvous.settings import RunSettings
from tensorflow_elastic.rendezvous.types import NodeBounds


def test_the_agent_joins_its_workers_nodes_in_one_call_each_generation(monkeypatch):
    calls: collections.Counter[str] = collections.Counter()
    for name in ("Join", "JoinMany"):
        served = getattr(RendezvousService, name)

        async def counted(self, request, context, served=served, name=name):
            calls[name] += 1
            return await served(self, request, context)

        monkeypatch.setattr(RendezvousService, name, counted)
    with Orchestrator("127.0.0.1", 0, settings=RunSettings(heartbeat_timeout=5.0)) as server:
        spec = WorkerSpec(entrypoint="train.py", args=[], rdzv_endpoint=server.endpoint,
                          run_id="job", bounds=NodeBounds(3, 3), join_timeout=20.0)
        elasticity = RestartElasticity(
            spec, [f"127.0.0.1:{23460 + i}" for i in range(3)], threading.Event())
        try:
            view = elasticity.form()
            assert sorted(view.node_ids) == [0, 1, 2] and view.world_size == 3
            assert calls == {"JoinMany": 1}
            assert all(c.heartbeat_error is None for c in elasticity._clients)  # noqa: SLF001
            again = elasticity.form()  # the agent re-joins: the next generation, one call
            assert (again.generation, again.node_ids) == (view.generation + 1, view.node_ids)
            assert calls == {"JoinMany": 2}
            assert '"index": 0' in elasticity.launch(0).env["TF_CONFIG"]
        finally:
            elasticity.close()
