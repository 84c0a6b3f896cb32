"""A real etcd server for the tests and benchmarks: its own ports on 127.0.0.1 and its data in a
directory the caller owns; started and stopped (or killed) by pid.

Its raft timings are short so that a lease of 1 s is allowed (etcd raises a shorter TTL to
1.5 election timeouts) and leader failover is quick to test.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time

import grpc

from tensorflow_elastic.proto import etcd_pb2, etcd_pb2_grpc

START_TIMEOUT_S = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EtcdServer:
    """``etcd`` on 127.0.0.1; :meth:`start` again after :meth:`kill` restarts it on the same
    ports and data (an etcd restart)."""

    def __init__(self, data_dir: str):
        self.binary = shutil.which("etcd")
        if self.binary is None:
            raise FileNotFoundError("etcd is not installed (apt-get install etcd-server)")
        self.data_dir = data_dir
        self.port = _free_port()
        self.peer_port = _free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.url = f"etcd://{self.endpoint}"
        self.proc: subprocess.Popen | None = None
        self._log = open(os.path.join(os.path.dirname(data_dir), "etcd.log"), "ab")

    def start(self) -> "EtcdServer":
        client, peer = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{self.peer_port}"
        self.proc = subprocess.Popen(
            [self.binary, "--name", "tfe-test", "--data-dir", self.data_dir,
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"tfe-test={peer}", "--heartbeat-interval", "50",
             "--election-timeout", "500", "--log-level", "error"],
            stdout=self._log, stderr=subprocess.STDOUT)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        with grpc.insecure_channel(self.endpoint) as channel:
            stub = etcd_pb2_grpc.KVStub(channel)
            while True:
                try:
                    stub.Range(etcd_pb2.RangeRequest(key=b"/"), timeout=1.0)
                    return
                except grpc.RpcError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"etcd did not start (exit code {self.proc.poll()}); "
                                           f"see {self._log.name}") from None
                    time.sleep(0.1)

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
