"""The devices a worker drives and where its replicas stand among the job's."""

import pytest

from tensorflow_elastic.strategy.devices import local_devices, replica_layout

WORKER = "/job:worker/task:3"


def test_every_gpu_when_there_are_some_else_the_cpu():
    assert local_devices(WORKER, None, 2) == (
        (f"{WORKER}/device:GPU:0", f"{WORKER}/device:GPU:1"), "GPU")
    assert local_devices(WORKER, None, 0) == ((f"{WORKER}/device:CPU:0",), "CPU")


def test_an_explicit_list_is_qualified_with_the_worker():
    assert local_devices(WORKER, ["CPU:0", "/device:cpu:1"], 4) == (
        (f"{WORKER}/device:CPU:0", f"{WORKER}/device:CPU:1"), "CPU")
    assert local_devices(WORKER, ["GPU:1"], 2) == ((f"{WORKER}/device:GPU:1",), "GPU")


@pytest.mark.parametrize("devices", [[], "CPU:0", ["CPU:0", "GPU:0"], ["CPU"], ["CPU:0", "CPU:0"]])
def test_a_bad_list_is_refused(devices):
    with pytest.raises(ValueError):
        local_devices(WORKER, devices, 0)


def test_replicas_are_ordered_by_member_then_device():
    counts = {7: 2, 2: 1, 4: 2}
    assert [replica_layout(counts, node) for node in (2, 4, 7)] == [(5, 0), (5, 1), (5, 3)]
