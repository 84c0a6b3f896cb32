"""Serving Prometheus metrics over HTTP: one endpoint for one or more registries.

The orchestrator and the agent each keep their own registry (several can run
in one process); a launcher that embeds the orchestrator serves both on one port.
"""

from __future__ import annotations

import argparse
from typing import Iterator, Sequence

import prometheus_client as prom
from prometheus_client.metrics_core import Metric

from tensorflow_elastic import net


class _Union:
    """A collector that yields the metrics of several registries."""

    def __init__(self, registries: Sequence[prom.CollectorRegistry]):
        self._registries = list(registries)

    def collect(self) -> Iterator[Metric]:
        for registry in self._registries:
            yield from registry.collect()


class Endpoint:
    """/metrics of ``registries`` at http://HOST:PORT, from :meth:`serve` until :meth:`close`."""

    def __init__(self, *registries: prom.CollectorRegistry):
        if len(registries) == 1:
            self._registry = registries[0]
        else:
            self._registry = prom.CollectorRegistry(auto_describe=False)
            self._registry.register(_Union(registries))
        self._server = None

    def serve(self, host: str, port: int) -> int:
        """Starts serving; returns the port (``port`` 0 picks a free one)."""
        self._server, _ = prom.start_http_server(port, addr=host, registry=self._registry)
        return self._server.server_address[1]

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def add_flags(parser: argparse.ArgumentParser, what: str) -> None:
    """--metrics_port and --metrics_host, as every command that serves metrics spells them."""
    parser.add_argument("--metrics_port", type=int, metavar="PORT",
                        help=f"serve Prometheus metrics ({what}) at "
                        f"http://METRICS_HOST:PORT/metrics; 0 picks a port")
    parser.add_argument("--metrics_host", default="127.0.0.1",
                        help="address the metrics are served on (default: %(default)s)")


def url(host: str, port: int) -> str:
    """What a command prints once it serves metrics (``metrics on URL``)."""
    return f"http://{net.format_address(host, port)}/metrics"
