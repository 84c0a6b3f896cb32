"""Kubernetes discovery inside a pod: the API asked over HTTPS with the service account,
against a fake API server on 127.0.0.1 (no kubectl on PATH)."""

from __future__ import annotations

import http.server
import json
import ssl
import subprocess
import threading
import urllib.parse
from pathlib import Path
from typing import Iterator

import pytest

from tensorflow_elastic.launch.discovery import kubernetes_api

from .test_discovery import KUBERNETES, run

TOKEN = "sa-token-123"


def api_pod(ip: str, phase: str = "Running", ready: str = "True", deleting: str | None = None):
    metadata = {"name": f"w-{ip}"}
    if deleting:
        metadata["deletionTimestamp"] = deleting
    return {"metadata": metadata, "status": {"podIP": ip, "phase": phase, "conditions": [
        {"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": ready}]}}


class FakeApiServer:
    """An HTTPS server that answers pod lists and records each request's path and token."""

    def __init__(self, cert: str, key: str):
        self.requests: list[tuple[str, str]] = []
        self.status, self.body = 200, {"kind": "PodList", "items": []}
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                fake.requests.append((self.path, self.headers.get("Authorization", "")))
                data = json.dumps(fake.body).encode()
                self.send_response(fake.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def api(tls_files) -> Iterator[FakeApiServer]:
    server = FakeApiServer(*tls_files)
    yield server
    server.close()


@pytest.fixture
def account(tmp_path, tls_files) -> Path:
    """A service account directory as the kubelet mounts it."""
    path = tmp_path / "serviceaccount"
    path.mkdir()
    (path / "token").write_text(TOKEN + "\n")
    (path / "ca.crt").write_text(Path(tls_files[0]).read_text())
    (path / "namespace").write_text("training")
    return path


def discover(bin_dir, api, account, *flags):
    return run(bin_dir, KUBERNETES, "-l", "app=train", "--slots", "2",
               "--service_account_dir", str(account), *flags,
               KUBERNETES_SERVICE_HOST="127.0.0.1", KUBERNETES_SERVICE_PORT=str(api.port))


@pytest.fixture
def bin_dir(tmp_path) -> Path:
    """An empty PATH: no kubectl to fall back on."""
    path = tmp_path / "bin"
    path.mkdir()
    return path


def test_inside_a_pod_the_api_lists_the_usable_pods_with_the_service_account(bin_dir, api,
                                                                            account):
    api.body["items"] = [api_pod("10.0.0.11"), api_pod("10.0.0.10"),
                         api_pod("10.0.0.12", ready="False"), api_pod("10.0.0.13", "Pending"),
                         api_pod("10.0.0.14", deleting="2026-01-01T00:00:00Z"), api_pod("")]
    result = discover(bin_dir, api, account)
    assert (result.returncode, result.stdout) == (0, "10.0.0.10:2\n10.0.0.11:2\n"), result.stderr
    ((path, authorization),) = api.requests
    url = urllib.parse.urlsplit(path)
    assert url.path == "/api/v1/namespaces/training/pods"
    assert urllib.parse.parse_qs(url.query) == {"labelSelector": ["app=train"]}
    assert authorization == f"Bearer {TOKEN}"


def test_a_namespace_flag_wins_over_the_accounts(bin_dir, api, account):
    api.body["items"] = [api_pod("10.0.0.10")]
    assert discover(bin_dir, api, account, "-n", "ml").returncode == 0
    assert api.requests[0][0].startswith("/api/v1/namespaces/ml/pods?")


def test_a_refusal_of_the_api_is_a_message_and_exit_1(bin_dir, api, account):
    api.status, api.body = 403, {"kind": "Status", "message": "pods is forbidden"}
    result = discover(bin_dir, api, account)
    assert (result.returncode, result.stdout) == (1, "")
    assert "refused to list pods (403)" in result.stderr and "forbidden" in result.stderr


def test_a_server_the_ca_does_not_vouch_for_is_refused(bin_dir, api, account, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-keyout", str(other / "key.pem"),
                    "-out", str(account / "ca.crt")], check=True, capture_output=True, timeout=60)
    result = discover(bin_dir, api, account)
    assert result.returncode == 1 and "did not answer" in result.stderr
    assert api.requests == []


def test_outside_a_pod_there_is_no_in_cluster_config(account):
    assert kubernetes_api.in_cluster({}, str(account)) is None
    assert kubernetes_api.in_cluster({"KUBERNETES_SERVICE_HOST": "10.96.0.1"},
                                     str(account / "missing")) is None
    config = kubernetes_api.in_cluster({"KUBERNETES_SERVICE_HOST": "fd00::1"}, str(account))
    assert config.server == "https://[fd00::1]:443" and config.namespace == "training"
