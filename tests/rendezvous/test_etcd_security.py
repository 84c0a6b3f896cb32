"""The orchestrator on an etcd that serves TLS only, asks for client certificates and has
authentication on (a CA and certificates made for the test)."""

from __future__ import annotations

import shutil
import subprocess
import time

import grpc
import pytest

from tensorflow_elastic.proto import etcd_pb2 as epb
from tensorflow_elastic.proto import etcd_pb2_grpc as epb_grpc
from tensorflow_elastic.rendezvous import Client, etcd
from tensorflow_elastic.rendezvous.etcd_store import leader_key
from tensorflow_elastic.rendezvous.server import Orchestrator
from tests.conftest import wait_until
from tools.etcd_server import EtcdServer

# A real etcd on a port chosen before it starts: no other test process beside it.
pytestmark = pytest.mark.serial

PASSWORD = "etcd-root-password"


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _certificates(directory) -> dict[str, str]:
    """A throwaway CA and two certificates it signs: etcd's (for 127.0.0.1) and a client's."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    paths = {name: str(directory / f"{name}.pem") for name in
             ("ca", "ca_key", "server", "server_key", "client", "client_key")}
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-days", "1", "-subj", "/CN=tfelastic test CA",
             "-keyout", paths["ca_key"], "-out", paths["ca"])
    for name, extensions in (("server", "subjectAltName=IP:127.0.0.1\n"),
                             ("client", "extendedKeyUsage=clientAuth\n")):
        request, extfile = directory / f"{name}.csr", directory / f"{name}.ext"
        extfile.write_text(extensions)
        _openssl("req", *ec, "-subj", f"/CN=tfelastic {name}", "-keyout",
                 paths[f"{name}_key"], "-out", str(request))
        _openssl("x509", "-req", "-in", str(request), "-CA", paths["ca"], "-CAkey",
                 paths["ca_key"], "-CAcreateserial", "-days", "1", "-extfile", str(extfile),
                 "-out", paths[name])
    return paths


def _enable_authentication(server: EtcdServer, certificates: dict[str, str]) -> None:
    """A root user with PASSWORD, then authentication on (what `etcdctl auth enable` does)."""
    with open(certificates["ca"], "rb") as ca, open(certificates["client"], "rb") as cert, \
            open(certificates["client_key"], "rb") as key:
        credentials = grpc.ssl_channel_credentials(ca.read(), key.read(), cert.read())
    with grpc.secure_channel(server.endpoint, credentials) as channel:
        stub = epb_grpc.AuthStub(channel)
        stub.UserAdd(epb.AuthUserAddRequest(name="root", password=PASSWORD), timeout=10)
        stub.RoleAdd(epb.AuthRoleAddRequest(name="root"), timeout=10)
        stub.UserGrantRole(epb.AuthUserGrantRoleRequest(user="root", role="root"), timeout=10)
        stub.AuthEnable(epb.AuthEnableRequest(), timeout=10)


@pytest.fixture
def secured_etcd(tmp_path):
    certificates = _certificates(tmp_path)
    try:
        server = EtcdServer(str(tmp_path / "etcd"),
                            tls=(certificates["ca"], certificates["server"],
                                 certificates["server_key"]),
                            extra_args=("--auth-token-ttl", "1")).start()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    _enable_authentication(server, certificates)
    yield server, certificates
    server.stop()


def _access(certificates: dict[str, str], password: str = PASSWORD) -> etcd.EtcdAccess:
    return etcd.EtcdAccess(certificates["ca"], certificates["client"],
                           certificates["client_key"], "root", password)


def test_a_replica_leads_through_etcd_over_tls_as_an_etcd_user(secured_etcd):
    server, certificates = secured_etcd
    with Orchestrator("127.0.0.1", 0, store=f"etcds://{server.endpoint}/secure",
                      store_access=_access(certificates)) as replica:
        with Client(replica.endpoint, "job", retry_timeout=20) as client:
            assert client.register("127.0.0.1:5000", 1, 2) == 0
    reader = etcd.EtcdClient((server.endpoint,), tls=True, access=_access(certificates))
    try:
        assert reader.get(leader_key("/secure")) is None  # revoked at the stop
        assert len(list(reader.scan(b"/secure/runs/"))) == 1
        time.sleep(2.5)  # past etcd's --auth-token-ttl: the client authenticates again
        assert len(list(reader.scan(b"/secure/runs/"))) == 1
    finally:
        reader.close()


def test_etcd_refuses_a_client_without_its_certificate_user_or_password(secured_etcd):
    server, certificates = secured_etcd
    attempts = {
        "plaintext": etcd.EtcdClient((server.endpoint,), timeout=1.0),
        "no client certificate": etcd.EtcdClient(
            (server.endpoint,), timeout=1.0, tls=True,
            access=etcd.EtcdAccess(ca=certificates["ca"], user="root", password=PASSWORD)),
        "no user": etcd.EtcdClient((server.endpoint,), timeout=1.0, tls=True,
                                   access=etcd.EtcdAccess(certificates["ca"],
                                                          certificates["client"],
                                                          certificates["client_key"])),
        "wrong password": etcd.EtcdClient((server.endpoint,), timeout=1.0, tls=True,
                                          access=_access(certificates, "guess")),
    }
    for what, client in attempts.items():
        try:
            with pytest.raises((etcd.EtcdUnavailable, grpc.RpcError)):
                client.get(leader_key("/secure"))
                pytest.fail(f"etcd answered a client with {what}")
        finally:
            client.close()


def test_a_replica_that_etcd_refuses_does_not_start(secured_etcd):
    server, certificates = secured_etcd
    replica = Orchestrator("127.0.0.1", 0, store=f"etcds://{server.endpoint}/secure",
                           store_access=_access(certificates, "guess"))
    with pytest.raises(OSError, match="refused this orchestrator"):
        replica.start()


def test_the_orchestrator_command_takes_the_etcd_tls_and_user_flags(secured_etcd,
                                                                   start_orchestrator,
                                                                   tmp_path):
    server, certificates = secured_etcd
    password_file = tmp_path / "etcd-password"
    password_file.write_text(PASSWORD + "\n")
    replica = start_orchestrator(
        "--store", f"etcds://{server.endpoint}/cli", "--etcd_ca", certificates["ca"],
        "--etcd_cert", certificates["client"], "--etcd_key", certificates["client_key"],
        "--etcd_user", "root", "--etcd_password_file", str(password_file))
    replica.wait_for_line("this replica", timeout=30)  # ... leads now
    reader = etcd.EtcdClient((server.endpoint,), tls=True, access=_access(certificates))
    try:
        wait_until(lambda: reader.get(leader_key("/cli")), timeout=10, what="the leader key")
    finally:
        reader.close()
