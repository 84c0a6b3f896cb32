"""The orchestrator a launcher embeds (`tfelastic-run --standalone`, `tensorflowrun`).

One way to check its settings, start it and announce it, so both launchers
refuse the same unsafe settings with the same words.
"""

from __future__ import annotations

import os

from tensorflow_elastic import net
from tensorflow_elastic.observability import prometheus
from tensorflow_elastic.rendezvous import Orchestrator, RunSettings, auth


def tls_files(cert: str | None, key: str | None) -> tuple[str | None, str | None]:
    """The certificate and key as absolute paths; ValueError unless both or neither exist."""
    if (cert is None) != (key is None):
        raise ValueError("--tls_cert and --tls_key go together")
    for flag, path in (("tls_cert", cert), ("tls_key", key)):
        if path and not os.path.isfile(path):
            raise ValueError(f"--{flag} {path}: no such file")
    return (os.path.abspath(cert) if cert else None, os.path.abspath(key) if key else None)


def serve(endpoint: str, token: str | None, tls_cert: str | None, tls_key: str | None,
          insecure: bool, events_file: str | None, one_job: bool = True,
          metrics_port: int | None = None, metrics_host: str = "127.0.0.1") -> Orchestrator:
    """Starts an orchestrator at `endpoint` and prints `listening on HOST:PORT` (and where
    its metrics are, with `metrics_port`).

    ``one_job``: it serves the launcher's own job, so a node that comes after the job completed
    is told so instead of starting the run again (False: it serves job after job).

    Raises ValueError for settings that are refused (they say what to do) and
    OSError when the address cannot be served.
    """
    host, port = net.parse_address(endpoint, allow_port_zero=True)
    refusal = auth.exposure_error(host, token, insecure)
    if refusal:
        raise ValueError(refusal)
    server = Orchestrator(host, port, token=token, tls_cert=tls_cert, tls_key=tls_key,
                          events_file=events_file, metrics_port=metrics_port,
                          metrics_host=metrics_host,
                          settings=RunSettings(restart_completed=not one_job))
    try:
        server.start()
    except (OSError, RuntimeError, TimeoutError) as e:
        raise OSError(f"cannot serve the orchestrator at {endpoint}: {e}; pick a free port with "
                      f"--rdzv_endpoint HOST:PORT") from None
    if server.metrics_port is not None:
        print(f"metrics on {prometheus.url(metrics_host, server.metrics_port)}", flush=True)
    print(f"listening on {server.endpoint}", flush=True)
    return server
