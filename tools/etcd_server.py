"""A real etcd server for the tests and benchmarks: its own ports on 127.0.0.1 and its data in a
directory the caller owns; started and stopped (or killed) by pid.

Its raft timings are short so that a lease of 1 s is allowed (etcd raises a shorter TTL to
1.5 election timeouts) and leader failover is quick to test. With ``tls`` (CA, certificate and
key PEM paths) it serves over TLS and asks clients for a certificate signed by that CA.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time

from tensorflow_elastic.rendezvous.etcd import EtcdAccess, EtcdClient, EtcdUnavailable

START_TIMEOUT_S = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EtcdServer:
    """``etcd`` on 127.0.0.1; :meth:`start` again after :meth:`kill` restarts it on the same
    ports and data (an etcd restart)."""

    def __init__(self, data_dir: str, tls: tuple[str, str, str] | None = None,
                 extra_args: tuple[str, ...] = ()):
        self.binary = shutil.which("etcd")
        if self.binary is None:
            raise FileNotFoundError("etcd is not installed (apt-get install etcd-server)")
        self.data_dir = data_dir
        self.port = _free_port()
        self.peer_port = _free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.tls = tls
        self.extra_args = extra_args
        self.url = f"{'etcds' if tls else 'etcd'}://{self.endpoint}"
        self.proc: subprocess.Popen | None = None
        self._log = open(os.path.join(os.path.dirname(data_dir), "etcd.log"), "ab")

    def start(self) -> "EtcdServer":
        scheme = "https" if self.tls else "http"
        client, peer = f"{scheme}://127.0.0.1:{self.port}", f"http://127.0.0.1:{self.peer_port}"
        tls_args = []
        if self.tls:
            ca, cert, key = self.tls
            tls_args = ["--trusted-ca-file", ca, "--cert-file", cert, "--key-file", key,
                        "--client-cert-auth"]
        self.proc = subprocess.Popen(
            [self.binary, "--name", "tfe-test", "--data-dir", self.data_dir,
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"tfe-test={peer}", "--heartbeat-interval", "50",
             "--election-timeout", "500", "--log-level", "error", *tls_args,
             *self.extra_args],
            stdout=self._log, stderr=subprocess.STDOUT)
        self._wait_ready()
        return self

    def client(self, **access: str) -> EtcdClient:
        """A client of this etcd (over TLS with the server's own certificate when it has
        TLS); ``access`` adds a user and password."""
        if self.tls:
            ca, cert, key = self.tls
            access = dict(dict(ca=ca, cert=cert, key=key), **access)
        return EtcdClient((self.endpoint,), timeout=1.0, tls=bool(self.tls),
                          access=EtcdAccess(**access))

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        client = self.client()
        try:
            while True:
                try:
                    client.get(b"/")
                    return
                except EtcdUnavailable:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"etcd did not start (exit code {self.proc.poll()}); "
                                           f"see {self._log.name}") from None
                    time.sleep(0.1)
        finally:
            client.close()

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        self.signal(signal.SIGTERM)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()
