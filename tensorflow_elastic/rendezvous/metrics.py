"""Prometheus metrics of the orchestrator.

Each orchestrator owns its registry, so several can run in one process (the
launcher embeds one; tests start many) without clashing on metric names.
"""

from __future__ import annotations

import prometheus_client as prom

from tensorflow_elastic.observability.prometheus import Endpoint
from tensorflow_elastic.proto import rendezvous_pb2 as pb

_SERVICE = pb.DESCRIPTOR.services_by_name["Rendezvous"]
_METHODS = frozenset(m.name for m in _SERVICE.methods)


class Metrics:
    """Members, generation, waiting nodes, rendezvous durations and RPC counts."""

    def __init__(self) -> None:
        self.registry = prom.CollectorRegistry()
        self.members = prom.Gauge("tfelastic_members", "Members of the current generation.",
                                  ["run_id"], registry=self.registry)
        self.generation = prom.Gauge("tfelastic_generation", "Current generation number.",
                                     ["run_id"], registry=self.registry)
        self.waiting = prom.Gauge("tfelastic_waiting_nodes",
                                  "Nodes waiting to be admitted to a generation.",
                                  ["run_id"], registry=self.registry)
        self.rendezvous = prom.Histogram(
            "tfelastic_rendezvous_duration_seconds",
            "From the end of a generation (or the first join) until every member of the next "
            "one knows it.", ["run_id"], registry=self.registry,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300))
        self.rpcs = prom.Counter("tfelastic_rpcs", "RPCs served, by method and status code.",
                                 ["method", "code"], registry=self.registry)
        self._endpoint = Endpoint(self.registry)
        # The labelled series, looked up once: a formation reports every join and counts
        # every call, and a lookup by labels costs more than the update.
        self._run_gauges: dict[str, tuple[prom.Gauge, prom.Gauge, prom.Gauge]] = {}
        self._rpc_counts: dict[tuple[str, str], prom.Counter] = {}

    def membership_changed(self, run_id: str, generation: int, members: int,
                           waiting: int) -> None:
        gauges = self._run_gauges.get(run_id)
        if gauges is None:
            gauges = self._run_gauges[run_id] = (self.members.labels(run_id),
                                                 self.generation.labels(run_id),
                                                 self.waiting.labels(run_id))
        gauges[0].set(members)
        gauges[1].set(generation)
        gauges[2].set(waiting)

    def rendezvous_done(self, run_id: str, seconds: float) -> None:
        self.rendezvous.labels(run_id).observe(seconds)

    def forget_run(self, run_id: str) -> None:
        """Drops a deleted run's series, so that expired runs do not pile up in /metrics."""
        self._run_gauges.pop(run_id, None)
        for metric in (self.members, self.generation, self.waiting, self.rendezvous):
            try:
                metric.remove(run_id)
            except KeyError:
                pass  # the run never had this series

    def rpc_done(self, method: str, code: str, count: int = 1) -> None:
        """Counts ``count`` calls of ``method`` that ended with ``code`` (a JoinMany's entries
        count as Join calls, the successful ones at once)."""
        counter = self._rpc_counts.get((method, code))
        if counter is None:  # methods and codes are few (rpc_refused names no other method)
            counter = self._rpc_counts[method, code] = self.rpcs.labels(method, code)
        counter.inc(count)

    def rpc_refused(self, path: str) -> None:
        """Counts a call refused for its token, under its method's name; a path outside the
        service counts as "other", so callers cannot make up labels."""
        prefix = f"/{_SERVICE.full_name}/"
        method = path[len(prefix):] if path.startswith(prefix) else ""
        self.rpc_done(method if method in _METHODS else "other", "UNAUTHENTICATED")

    def serve(self, host: str, port: int) -> int:
        """Serves /metrics over HTTP; returns the port (``port`` 0 picks a free one)."""
        return self._endpoint.serve(host, port)

    def close(self) -> None:
        self._endpoint.close()
