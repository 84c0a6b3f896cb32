"""`tfelastic-run --slurm`: one launcher per node started by srun, placed by the SLURM_* variables."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tensorflow_elastic.launch import launcher, slurm

from .conftest import ELASTIC_WORKER, HERE, env, free_port

SRUN_ENV = {"SLURM_JOB_NODELIST": "node[07-09],gpu1", "SLURM_NTASKS": "3", "SLURM_PROCID": "0",
            "SLURM_NODEID": "0"}


@pytest.mark.parametrize("nodelist, first", [
    ("node07", "node07"), ("node[07-09,12],gpu1", "node07"), ("gpu1,node[2-3]", "gpu1"),
    ("rack[1-2]-n[05-06]", "rack1-n05"), ("127.0.0.1", "127.0.0.1")])
def test_the_orchestrator_runs_on_the_first_host_of_the_allocation(nodelist, first):
    assert slurm.first_host(nodelist) == first


def test_task_0_serves_and_the_others_connect():
    task = slurm.task_from_environment(SRUN_ENV)
    assert task == slurm.SlurmTask("node07", 0, 0, 3) and task.serves_orchestrator
    other = slurm.task_from_environment({**SRUN_ENV, "SLURM_PROCID": "2", "SLURM_NODEID": "2"})
    assert not other.serves_orchestrator


@pytest.mark.parametrize("change, reason", [
    ({"SLURM_JOB_NODELIST": None}, "SLURM_JOB_NODELIST is not set"),
    ({"SLURM_NTASKS": "three"}, "not a whole number"),
    ({"SLURM_PROCID": "3"}, "is not below"),
    ({"SLURM_NODEID": "1"}, "not on the first host"),
    ({"SLURM_JOB_NODELIST": "node[07-09"}, "unclosed")])
def test_a_wrong_slurm_environment_is_refused_with_its_reason(change, reason):
    environment = {k: v for k, v in {**SRUN_ENV, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=reason):
        slurm.task_from_environment(environment)


def test_slurm_places_the_launcher_and_sets_the_job_size(monkeypatch, tmp_path):
    for name, value in {**SRUN_ENV, "SLURM_PROCID": "1", "SLURM_NODEID": "1"}.items():
        monkeypatch.setenv(name, value)
    script = tmp_path / "train.py"
    script.write_text("")
    args = launcher.build_parser().parse_args(["--slurm", "--rdzv_endpoint", ":29500",
                                               str(script)])
    launcher._check_args(args)
    assert (args.rdzv_endpoint, args.nnodes, args.standalone) == ("node07:29500", "3", False)


def test_slurm_takes_only_a_port_for_the_orchestrator(monkeypatch, tmp_path, capsys):
    for name, value in SRUN_ENV.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exit_:
        launcher.main(["--slurm", "--rdzv_endpoint", "elsewhere:29400", str(tmp_path)])
    assert exit_.value.code == 2 and ":PORT" in capsys.readouterr().err


@pytest.mark.multiprocess
def test_a_job_started_by_srun_trains_on_every_node_without_ssh(tmp_path):
    """Two launchers started by a fake srun find the orchestrator task 0 embeds and train
    one job of two workers to its end."""
    srun = [sys.executable, os.path.join(HERE, "fake_srun.py"), "--ntasks", "2"]
    launch = [sys.executable, "-m", "tensorflow_elastic.distributed.launch", "--slurm",
              f"--rdzv_endpoint=:{free_port()}", "--monitor_interval=0.5", ELASTIC_WORKER,
              "20", "0.02"]
    done = subprocess.run(srun + launch, env=env(), cwd=tmp_path, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    output = done.stdout + done.stderr
    finished = [json.loads(line.split("] ", 1)[1]) for line in output.splitlines()
                if '{"done"' in line]
    assert len(finished) == 2
    steps = [json.loads(line.split("] ", 1)[1]) for line in output.splitlines()
             if '"step": 20,' in line]
    assert {s["world"] for s in steps} == {2}
