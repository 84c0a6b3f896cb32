"""The parameter server over real gRPC in this process: pulls, pushes, bad input, checkpoints."""

from __future__ import annotations

import json
import os
import threading
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf

from tensorflow_elastic.observability import events
from tensorflow_elastic.proto import parameter_server_pb2 as pb
from tensorflow_elastic.ps import tensors
from tensorflow_elastic.ps.checkpoint import Checkpointer, CheckpointError
from tensorflow_elastic.ps.client import PSClient
from tensorflow_elastic.ps.config import PSConfig
from tensorflow_elastic.ps.errors import PSError
from tensorflow_elastic.ps.server import ParameterServer
from tensorflow_elastic.ps.worker import PSWorker

TIMEOUT_S = 60


def make_variables(seed: int = 0) -> list[tf.Variable]:
    rng = np.random.RandomState(seed)
    return [tf.Variable(rng.randn(4, 2).astype(np.float32)), tf.Variable(np.zeros(2, np.float32))]


def regression_gradient_fn(variables):
    w, b = variables
    true_w = np.random.RandomState(7).randn(4, 2).astype(np.float32)

    @tf.function
    def gradient(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((x @ w + b - x @ true_w) ** 2)
        return loss, tape.gradient(loss, [w, b])

    return gradient


def batches(seed: int, count: int | None = None):
    rng = np.random.RandomState(seed)
    produced = 0
    while count is None or produced < count:
        produced += 1
        yield tf.constant(rng.randn(16, 4).astype(np.float32))


def train_with_workers(server: ParameterServer, count: int) -> list:
    """Runs `count` worker threads until the job ends; their results."""
    results = []

    def work(seed: int) -> None:
        variables = make_variables(seed + 100)  # pulled parameters overwrite these
        worker = PSWorker(server.address, variables, regression_gradient_fn(variables))
        results.append(worker.run(batches(seed)))

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(count)]
    for thread in threads:
        thread.start()
    assert server.wait(TIMEOUT_S)
    for thread in threads:
        thread.join(TIMEOUT_S)
    return results


@pytest.fixture
def server_factory(tmp_path):
    servers = []

    def start(config: PSConfig | None = None, variables=None, **options) -> ParameterServer:
        options.setdefault("lease_timeout", 5.0)
        server = ParameterServer(variables or make_variables(), tf.keras.optimizers.SGD(0.1),
                                 config or PSConfig(policy="fifo"), **options)
        servers.append(server.start())
        return server

    yield start
    for server in servers:
        server.stop()


def test_round_trip_of_raw_tensors_keeps_values_shape_and_dtype():
    for array in (np.arange(12, dtype=np.float32).reshape(3, 4), np.array(3.5, np.float64),
                  np.zeros((0, 2), np.int64)):
        message = pb.PullResponse()
        tensors.encode_into(message.parameters, [array])
        back = tensors.decode(pb.PullResponse.FromString(message.SerializeToString()).parameters[0])
        assert back.dtype == array.dtype and back.shape == array.shape
        np.testing.assert_array_equal(back, array)


def test_a_buffer_that_does_not_match_its_shape_is_refused():
    message = pb.PullResponse()
    tensors.encode_into(message.parameters, [np.ones((2, 2), np.float32)])
    tensor = message.parameters[0]
    tensor.data = tensor.data[:-1]
    with pytest.raises(ValueError, match="needs 16 bytes, got 15"):
        tensors.decode(tensor)
    with pytest.raises(ValueError, match="unknown dtype"):
        tensors.decode(pb.RawTensor(dtype="float99", shape=[1], data=b"\0" * 4))


def test_a_pushed_gradient_is_applied_and_the_version_moves(server_factory):
    server = server_factory()
    before = [v.numpy().copy() for v in server.parameters.variables]
    with PSClient(server.address) as client:
        client.register()
        pulled = client.pull()
        assert pulled.version == 0 and len(pulled.parameters) == 2
        np.testing.assert_array_equal(tensors.decode(pulled.parameters[0]), before[0])
        gradient = [np.ones((4, 2), np.float32), np.ones(2, np.float32)]
        client.push(0, gradient, samples=16, loss=1.0)
        assert client.pull(have_version=0, min_version=1, wait_seconds=10).version == 1
        after = client.pull()
        np.testing.assert_allclose(tensors.decode(after.parameters[0]), before[0] - 0.1,
                                   rtol=1e-6)
        assert client.pull(have_version=1).parameters == []  # already current: nothing sent


def bad_call(client: PSClient, call, *args, **kwargs) -> PSError:
    with pytest.raises(PSError) as info:
        call(*args, **kwargs)
    return info.value


def test_bad_requests_get_clear_errors_are_counted_and_change_nothing(server_factory):
    server = server_factory()
    good = [np.ones((4, 2), np.float32), np.ones(2, np.float32)]
    with PSClient(server.address) as client, PSClient(server.address, run_id="other") as wrong:
        client.register()
        error = bad_call(wrong, wrong.register)
        assert error.code == grpc.StatusCode.FAILED_PRECONDITION and "'default'" in error.message
        error = bad_call(client, client.push, 0, [np.ones((4, 3), np.float32), good[1]])
        assert error.code == grpc.StatusCode.INVALID_ARGUMENT and "float32[4, 2]" in error.message
        error = bad_call(client, client.push, 0, [good[0].astype(np.float64), good[1]])
        assert "float64" in error.message
        error = bad_call(client, client.push, 0, good[:1])
        assert "expected 2 gradients" in error.message
        error = bad_call(client, client.push, 5, good)
        assert error.reason == "future_version" and "version 5" in error.message
        stranger = PSClient(server.address)
        stranger.worker_id = "99"
        error = bad_call(stranger, stranger._call, stranger._stub.Push,
                         pb.PushRequest(run_id="default", worker_id="99", version=0),
                         reregister=False)
        assert error.code == grpc.StatusCode.NOT_FOUND and "register" in error.message
        stranger.close()
        malformed = pb.PushRequest(run_id="default", worker_id=client.worker_id,
                                   worker_secret=client.worker_secret, version=0,
                                   gradients=[pb.RawTensor(dtype="float32", shape=[4, 2],
                                                           data=b"123")] * 2)
        error = bad_call(client, client._call, client._stub.Push, malformed)
        assert error.reason == "malformed"
        stats = json.loads(client.status().stats_json)
        assert stats["bad_requests"] == {"wrong_run": 1, "wrong_shape": 3, "future_version": 1,
                                         "unknown_worker": 1, "malformed": 1}
        assert server.parameters.version == 0
        client.push(0, good)  # the server is still up and still takes good gradients
        assert client.pull(have_version=0, min_version=1, wait_seconds=10).version == 1


def test_settings_change_while_running_and_bad_settings_are_refused(server_factory):
    server = server_factory(PSConfig(policy="asypq"))
    with PSClient(server.address) as client:
        config = json.loads(client.configure(synch_block_size=2, asynch_max=4).config_json)
        assert config["synch_block_size"] == 2 and config["asynch_max"] == 4
        assert server.master.config.synch_block_size == 2
        error = bad_call(client, client.configure, synch_block_size=8, asynch_max=2)
        assert error.code == grpc.StatusCode.INVALID_ARGUMENT and error.reason == "bad_config"
        assert server.master.config.synch_block_size == 2


def test_async_job_stops_after_workers_times_iterations_and_every_worker_acknowledges(
        server_factory):
    server = server_factory(PSConfig(policy="asypq", iterations=10, workers=2))
    results = train_with_workers(server, 2)
    assert sorted(r.reason for r in results) == ["stopped by the parameter server"] * 2
    stats = server.stats()
    assert stats["accepted"] >= 20
    assert stats["workers"] == []
    assert sum(r.iterations for r in results) >= 20


def test_synch_workers_count_their_own_iterations_and_loss_falls(server_factory):
    server = server_factory(PSConfig(policy="synch", iterations=15))
    first_loss = float(regression_gradient_fn(server.parameters.variables)(
        next(batches(5)))[0])
    results = train_with_workers(server, 3)
    assert [r.iterations for r in results] == [15, 15, 15]
    assert server.parameters.version == 15  # one update per round of 3 gradients
    last_loss = float(regression_gradient_fn(server.parameters.variables)(next(batches(5)))[0])
    assert last_loss < first_loss / 2


def test_a_worker_with_a_different_model_is_told_so(server_factory):
    server = server_factory()
    variables = [tf.Variable(np.zeros((3, 2), np.float32))]
    worker = PSWorker(server.address, variables, lambda batch: (0.0, []))
    with pytest.raises(ValueError, match="does not match the parameter server"):
        worker.run(batches(0, 1))


def test_checkpoint_resumes_version_parameters_and_master_counts(server_factory, tmp_path):
    directory = str(tmp_path / "ckpt")
    server = server_factory(PSConfig(policy="fifo"), checkpoint_dir=directory,
                            checkpoint_every=2)
    gradient = [np.ones((4, 2), np.float32), np.ones(2, np.float32)]
    with PSClient(server.address) as client:
        client.register()
        for version in range(4):
            client.push(version, gradient)
            client.pull(have_version=version, min_version=version + 1, wait_seconds=10)
    saved = [v.numpy().copy() for v in server.parameters.variables]
    accepted = server.stats()["accepted"]
    server.stop()
    resumed = server_factory(PSConfig(policy="fifo"), checkpoint_dir=directory,
                             checkpoint_every=2)
    assert resumed.restored_version == 4 and resumed.parameters.version == 4
    for variable, array in zip(resumed.parameters.variables, saved):
        np.testing.assert_array_equal(variable.numpy(), array)
    assert resumed.stats()["accepted"] == accepted and resumed.master.version == 4
    with PSClient(resumed.address) as client:
        assert int(client.register().worker_id) >= 1  # ids are never reused
        client.push(4, gradient)  # a gradient on the restored version is current, not "future"
        assert client.pull(have_version=4, min_version=5, wait_seconds=10).version == 5


def test_a_corrupt_newest_checkpoint_falls_back_and_a_foreign_one_is_an_error(tmp_path):
    directory = str(tmp_path / "ckpt")
    variables = make_variables()
    optimizer = tf.keras.optimizers.SGD(0.1)
    optimizer.build(variables)
    checkpointer = Checkpointer(directory, variables, optimizer)
    checkpointer.save(2, {"accepted": 2})
    variables[0].assign(variables[0] + 1.0)
    checkpointer.save(4, {"accepted": 4})
    newest = [f for f in os.listdir(directory) if f.startswith("ps-4") and "data" in f][0]
    with open(os.path.join(directory, newest), "r+b") as f:
        f.write(b"garbage" * 10)
    version, state = Checkpointer(directory, variables, optimizer).restore()
    assert (version, state["accepted"]) == (2, 2)
    other = [tf.Variable(np.zeros((5, 5), np.float32)), tf.Variable(np.zeros(2, np.float32))]
    other_optimizer = tf.keras.optimizers.SGD(0.1)
    other_optimizer.build(other)
    with pytest.raises(CheckpointError, match="does not fit this model"):
        Checkpointer(directory, other, other_optimizer).restore()



def test_tfelastic_ps_status_and_ps_configure(server_factory, capsys):
    from tensorflow_elastic import cli

    server = server_factory(PSConfig(policy="asypq"))
    with PSClient(server.address) as client:
        client.register()
        client.push(0, [np.ones((4, 2), np.float32), np.ones(2, np.float32)], loss=0.5)
        client.pull(have_version=0, min_version=1, wait_seconds=10)
        assert cli.main(["ps-status", "--ps_address", server.address]) == 0
        out = capsys.readouterr().out
        assert "version 1, policy asypq, 1 live worker(s)" in out and "accepted 1" in out
        assert cli.main(["ps-configure", "--ps_address", server.address,
                         "--synch_block_size", "2"]) == 0
        assert json.loads(capsys.readouterr().out)["synch_block_size"] == 2
        assert cli.main(["ps-configure", "--ps_address", server.address,
                         "--synch_block_size", "4", "--asynch_max", "2"]) == 1
        assert "bad_config" in capsys.readouterr().err
        assert server.master.config.synch_block_size == 2
        assert cli.main(["ps-configure", "--ps_address", server.address]) == 2
        assert cli.main(["ps-status", "--ps_address", server.address, "--run_id", "x"]) == 1
        assert "wrong_run" in capsys.readouterr().err


def test_a_preempted_worker_pushes_its_gradient_in_flight_then_leaves(server_factory):
    server = server_factory(PSConfig(policy="fifo"))
    variables = make_variables(100)
    gradient_fn = regression_gradient_fn(variables)
    worker = PSWorker(server.address, variables, gradient_fn)

    def stop_after_three(batch):
        result = gradient_fn(batch)
        if server.stats()["accepted"] >= 2:
            worker.request_stop()  # arrives while a gradient is being computed
        return result

    worker.gradient_fn = stop_after_three
    result = worker.run(batches(0, 100))
    assert result.reason == "stop requested"
    server.parameters.wait_for(result.iterations, TIMEOUT_S, server.stopping)
    stats = server.stats()
    assert stats["accepted"] == result.iterations >= 3  # every pushed gradient counts
    assert stats["workers"] == [] and not server.stopping.is_set()  # the job goes on


def test_ps_events_carry_the_parameter_version_and_no_membership_generation(server_factory,
                                                                            tmp_path):
    events_file = str(tmp_path / "events.jsonl")
    server = server_factory(events_file=events_file, step_events_every=1)
    with PSClient(server.address) as client:
        client.register()
        client.push(0, [np.ones((4, 2), np.float32), np.ones(2, np.float32)], loss=0.5)
        client.pull(have_version=0, min_version=1, wait_seconds=10)
        client.leave(finished=False, reason="preempted")
    deadline = time.monotonic() + TIMEOUT_S
    recorded = {}
    while events.STEP not in recorded and time.monotonic() < deadline:  # recorded after the apply
        time.sleep(0.01)
        recorded = {e["event"]: e for e in events.read_events(events_file)}
    assert recorded[events.NODE_JOINED]["version"] == 0
    assert recorded[events.STEP]["version"] == recorded[events.STEP]["step"] == 1
    assert recorded[events.NODE_LEFT]["version"] == 1
    assert all(e["generation"] is None for e in recorded.values())


def test_the_master_state_is_fsynced_before_its_rename_and_the_directory_after(tmp_path,
                                                                              monkeypatch):
    import stat

    from tensorflow_elastic.ps import checkpoint

    calls = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append("fsync directory" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(source: str, target: str) -> None:
        calls.append("rename" if os.path.basename(target).startswith("master-") else "other")
        real_replace(source, target)

    monkeypatch.setattr(checkpoint.os, "fsync", fsync)
    monkeypatch.setattr(checkpoint.os, "replace", replace)
    variables = make_variables()
    Checkpointer(str(tmp_path), variables, tf.keras.optimizers.SGD(0.1)).save(3, {"version": 3})
    assert calls[:3] == ["fsync file", "rename", "fsync directory"]
