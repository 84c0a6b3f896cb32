"""Which GPUs each worker of a launcher sees (a pure decision on a given GPU count)."""

import pytest

from tensorflow_elastic.launch.gpus import ALL, SPLIT, visible_gpus, worker_gpu_env


def _envs(nproc, gpus, placement=SPLIT):
    return [worker_gpu_env(slot, nproc, gpus, placement) for slot in range(nproc)]


def test_one_worker_per_gpu_gets_its_own():
    assert _envs(4, ["0", "1", "2", "3"]) == [
        {"LOCAL_RANK": str(i), "CUDA_VISIBLE_DEVICES": str(i)} for i in range(4)]


def test_fewer_workers_than_gpus_share_them_out():
    assert [e["CUDA_VISIBLE_DEVICES"] for e in _envs(2, ["0", "1", "2", "3"])] == ["0,1", "2,3"]


def test_more_workers_than_gpus_share_a_gpu():
    assert [e["CUDA_VISIBLE_DEVICES"] for e in _envs(3, ["4", "5"])] == ["4", "5", "4"]


def test_the_launcher_s_own_list_is_the_one_split():
    gpus = visible_gpus({"CUDA_VISIBLE_DEVICES": "2, 3"})
    assert [e["CUDA_VISIBLE_DEVICES"] for e in _envs(2, gpus)] == ["2", "3"]


def test_all_or_no_gpu_leaves_the_devices_alone():
    assert _envs(1, ["0", "1"], ALL) == [{"LOCAL_RANK": "0"}]
    assert _envs(2, []) == [{"LOCAL_RANK": "0"}, {"LOCAL_RANK": "1"}]


def test_visible_gpus_from_the_driver(tmp_path):
    for i in range(3):
        (tmp_path / f"0000:0{i}:00.0").mkdir()
    assert visible_gpus({}, str(tmp_path)) == ["0", "1", "2"]
    assert visible_gpus({}, str(tmp_path / "absent")) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, str(tmp_path)) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}, str(tmp_path)) == []


def test_a_bad_placement_or_slot_is_refused():
    with pytest.raises(ValueError):
        worker_gpu_env(0, 1, ["0"], "some")
    with pytest.raises(ValueError):
        worker_gpu_env(2, 2, ["0"])
