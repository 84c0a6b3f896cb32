"""Who may call a parameter server: the shared token, TLS, and a worker's proof of being itself."""

from __future__ import annotations

import json
import logging
import threading

import grpc
import numpy as np
import pytest

from tensorflow_elastic.proto import parameter_server_pb2 as pb
from tensorflow_elastic.proto import parameter_server_pb2_grpc as pb_grpc
from tensorflow_elastic.ps.client import PSClient
from tensorflow_elastic.ps.errors import NOT_THE_WORKER, UNAUTHENTICATED, PSError
from tensorflow_elastic.ps.server import ParameterServer

TOKEN = "s3cret-token"



def client_for(server: ParameterServer, **options) -> PSClient:
    return PSClient(server.address, server.run_id, call_timeout=10.0, reconnect_timeout=2.0,
                    **options)


def test_calls_without_the_token_are_unauthenticated_counted_and_logged_once(start_ps, caplog):
    server = start_ps(token=TOKEN)
    caplog.set_level(logging.WARNING, logger="tensorflow_elastic.ps.refusals")
    for token in (None, "wrong", TOKEN + "x"):
        with client_for(server, token=token) as stranger:
            for call in (stranger.register, stranger.status,
                         lambda: stranger.configure(synch_block_size=1)):
                with pytest.raises(PSError) as e:
                    call()
                assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
                assert e.value.reason == UNAUTHENTICATED and "token" in e.value.message
    assert server.live_workers() == [] and server.master.config.synch_block_size == 1
    with client_for(server, token=TOKEN) as member:
        member.register()
        member.configure(asynch_max=3)
        stats = json.loads(member.status().stats_json)
    assert stats["bad_requests"] == {UNAUTHENTICATED: 9}
    assert server.master.config.asynch_max == 3
    lines = [r for r in caplog.records if UNAUTHENTICATED in r.getMessage()]
    assert len(lines) == 1  # a flood is one line per interval, not one per call


def test_a_leave_with_a_guessed_worker_id_is_refused_and_the_job_goes_on(start_ps):
    server = start_ps()
    with client_for(server) as worker, client_for(server) as intruder:
        worker.register()
        stub = pb_grpc.ParameterServerStub(intruder._channel)
        for secret in ("", "0" * len(worker.worker_secret)):
            with pytest.raises(grpc.RpcError) as e:
                stub.Leave(pb.LeaveRequest(run_id=server.run_id, worker_id=worker.worker_id,
                                           worker_secret=secret, finished=True), timeout=10)
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        intruder.worker_id = worker.worker_id  # a stolen id alone does not re-register it
        with pytest.raises(PSError) as refused:
            intruder.register()
        assert refused.value.reason == NOT_THE_WORKER
        assert server.live_workers() == [worker.worker_id] and server.registry.finished == 0
        assert worker.heartbeat().version == 0
        worker.leave(finished=True)
    assert server.live_workers() == [] and server.registry.finished == 1


def test_tls_with_a_token_round_trip_and_plaintext_is_refused(start_ps, tls_files):
    cert, key = tls_files
    server = start_ps(token=TOKEN, tls_cert_file=cert, tls_key_file=key)
    with client_for(server, token=TOKEN, tls_ca_file=cert) as secure:
        secure.register()
        secure.push(0, [np.full(4, 0.5, np.float32)])
        assert secure.pull(have_version=0, min_version=1, wait_seconds=10).version == 1
    with client_for(server, token=TOKEN) as plaintext:
        with pytest.raises(PSError) as e:
            plaintext.status()
        assert e.value.code == grpc.StatusCode.UNAVAILABLE


def test_half_a_tls_configuration_is_refused(start_ps, tmp_path):
    with pytest.raises(ValueError, match="tls_key_file"):
        start_ps(tls_cert_file=str(tmp_path / "cert.pem"))


def test_ps_status_and_ps_configure_send_the_token_from_the_file_or_the_environment(
        start_ps, tmp_path, monkeypatch, capsys):
    from tensorflow_elastic import cli

    server = start_ps(token=TOKEN)
    monkeypatch.delenv("TFE_RDZV_TOKEN", raising=False)
    assert cli.main(["ps-status", "--ps_address", server.address]) == 1
    assert "UNAUTHENTICATED" in capsys.readouterr().err
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    assert cli.main(["ps-configure", "--ps_address", server.address, "--token_file",
                     str(token_file), "--asynch_max", "5"]) == 0
    assert server.master.config.asynch_max == 5
    monkeypatch.setenv("TFE_RDZV_TOKEN", TOKEN)
    assert cli.main(["ps-status", "--ps_address", server.address]) == 0


def test_threads_of_one_worker_that_find_it_forgotten_register_it_again_once(start_ps):
    """A restarted PS forgets every worker; a worker's heartbeat thread and its training loop
    both find out and must not lock each other out with their secrets."""
    server = start_ps()
    with client_for(server) as worker:
        worker.register()
        for _ in range(5):
            assert server.registry.remove(worker.worker_id, worker.worker_secret)
            errors = []

            def beat() -> None:
                try:
                    worker.heartbeat()
                except PSError as e:
                    errors.append(e)

            threads = [threading.Thread(target=beat) for _ in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            assert errors == [] and server.live_workers() == [worker.worker_id]
