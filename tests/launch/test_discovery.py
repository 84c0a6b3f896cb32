"""The discovery scripts, run as tensorflowrun runs them, against fake kubectl and scontrol.

Each fake is an executable first on PATH that records its arguments and
prints canned output, so the tests check both what the script asks the
cluster tool and what it makes of the answer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tensorflow_elastic.launch import hosts
from tensorflow_elastic.launch.discovery.kubernetes import POD_FIELDS

REPO_ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = "tensorflow_elastic.launch.discovery.kubernetes"
SLURM = "tensorflow_elastic.launch.discovery.slurm"


class FakeTool:
    """An executable named like a cluster tool that prints ``stdout`` and exits with ``code``."""

    def __init__(self, bin_dir: Path, name: str, stdout: str = "", stderr: str = "",
                 code: int = 0):
        self.calls_file = bin_dir / f"{name}.calls"
        path = bin_dir / name
        path.write_text(
            f"#!{sys.executable}\n"
            "import json, sys\n"
            f"with open({str(self.calls_file)!r}, 'a') as f:\n"
            "    f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
            f"sys.stdout.write({stdout!r})\n"
            f"sys.stderr.write({stderr!r})\n"
            f"sys.exit({code})\n")
        path.chmod(0o755)

    @property
    def calls(self) -> list[list[str]]:
        if not self.calls_file.exists():
            return []
        return [json.loads(line) for line in self.calls_file.read_text().splitlines()]


@pytest.fixture
def bin_dir(tmp_path) -> Path:
    """The only directory on the scripts' PATH: a tool not faked here is missing."""
    path = tmp_path / "bin"
    path.mkdir()
    return path


def run(bin_dir: Path, module: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {"PATH": str(bin_dir), "PYTHONPATH": str(REPO_ROOT), **env}
    return subprocess.run([sys.executable, "-m", module, *args], env=environ,
                          capture_output=True, text=True, timeout=60)


def pod(name: str, ip: str, phase: str = "Running", ready: str = "True", deleting: str = "") -> str:
    return "\t".join((name, ip, phase, ready, deleting)) + "\n"


# ------------------------------------------------------------------ kubernetes

def test_kubernetes_prints_running_ready_pods_and_asks_kubectl_for_them(bin_dir):
    kubectl = FakeTool(bin_dir, "kubectl", stdout=(
        pod("w-2", "10.0.0.12")
        + pod("w-0", "10.0.0.10")
        + pod("w-1", "10.0.0.11", ready="False")
        + pod("w-3", "", phase="Pending", ready="False")
        + pod("w-4", "10.0.0.14", deleting="2026-01-01T00:00:00Z")
        + pod("w-5", "10.0.0.15", phase="Succeeded", ready="False")
        + pod("w-6", "fd00::6")))
    result = run(bin_dir, KUBERNETES, "-l", "app=train", "-n", "ml", "--slots", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "10.0.0.10:2\n10.0.0.12:2\n[fd00::6]:2\n"
    assert kubectl.calls == [["get", "pods", "--selector", "app=train",
                              "--output", f"jsonpath={POD_FIELDS}", "--namespace", "ml"]]


def test_kubernetes_without_namespace_uses_kubectls_own(bin_dir):
    kubectl = FakeTool(bin_dir, "kubectl", stdout=pod("w-0", "10.0.0.10"))
    result = run(bin_dir, KUBERNETES, "--selector", "app=train")
    assert result.stdout == "10.0.0.10:1\n"
    assert "--namespace" not in kubectl.calls[0]


@pytest.mark.parametrize("stdout, stderr, code, message", [
    ("", "", 0, "no Running and Ready pod matches 'app=train' in namespace ml"),
    (pod("w-0", "10.0.0.10", ready="False"), "", 0, "no Running and Ready pod matches"),
    ("w-0 10.0.0.10 Running True\n", "", 0, "line 1: expected 5 tab-separated fields"),
    ("", "pods is forbidden: User cannot list resource", 1,
     "kubectl get pods exited with 1: pods is forbidden"),
])
def test_kubernetes_errors_go_to_stderr_with_exit_1(bin_dir, stdout, stderr, code, message):
    FakeTool(bin_dir, "kubectl", stdout=stdout, stderr=stderr, code=code)
    result = run(bin_dir, KUBERNETES, "-l", "app=train", "-n", "ml")
    assert (result.returncode, result.stdout) == (1, "")
    assert message in result.stderr


def test_kubernetes_without_kubectl_says_so(bin_dir):
    result = run(bin_dir, KUBERNETES, "-l", "app=train")
    assert result.returncode == 1
    assert "kubectl not found: install it or put it on PATH" in result.stderr


def test_kubernetes_needs_a_selector_and_explains_itself(bin_dir):
    missing = run(bin_dir, KUBERNETES)
    assert missing.returncode == 2 and "--selector" in missing.stderr
    usage = run(bin_dir, KUBERNETES, "--help")
    assert usage.returncode == 0
    assert "Running and Ready pods" in usage.stdout and "--slots" in usage.stdout


# ------------------------------------------------------------------ slurm

def test_slurm_prints_the_allocations_hosts_with_slots_from_the_environment(bin_dir):
    scontrol = FakeTool(bin_dir, "scontrol", stdout="node01\nnode02\n\nnode03\n")
    result = run(bin_dir, SLURM, SLURM_JOB_NODELIST="node[01-03]", SLURM_NTASKS_PER_NODE="4")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "node01:4\nnode02:4\nnode03:4\n"
    assert scontrol.calls == [["show", "hostnames", "node[01-03]"]]


def test_slurm_flags_win_over_the_environment(bin_dir):
    scontrol = FakeTool(bin_dir, "scontrol", stdout="gpu7\n")
    result = run(bin_dir, SLURM, "--slots", "2", "--nodelist", "gpu7",
                 SLURM_JOB_NODELIST="node[01-03]", SLURM_NTASKS_PER_NODE="4")
    assert result.stdout == "gpu7:2\n"
    assert scontrol.calls == [["show", "hostnames", "gpu7"]]


def test_slurm_defaults_to_one_slot(bin_dir):
    FakeTool(bin_dir, "scontrol", stdout="node01\n")
    assert run(bin_dir, SLURM, SLURM_JOB_NODELIST="node01").stdout == "node01:1\n"


@pytest.mark.parametrize("env, stdout, message", [
    ({}, "node01\n", "$SLURM_JOB_NODELIST is not set: run inside a Slurm allocation"),
    ({"SLURM_JOB_NODELIST": "node01", "SLURM_NTASKS_PER_NODE": "2(x3)"}, "node01\n",
     "$SLURM_NTASKS_PER_NODE='2(x3)': expected a whole number"),
    ({"SLURM_JOB_NODELIST": "node[01-02]"}, "", "scontrol names no host in 'node[01-02]'"),
    ({"SLURM_JOB_NODELIST": "node01"}, "node01 node02\n", "which is not a host name"),
])
def test_slurm_errors_go_to_stderr_with_exit_1(bin_dir, env, stdout, message):
    FakeTool(bin_dir, "scontrol", stdout=stdout)
    result = run(bin_dir, SLURM, **env)
    assert (result.returncode, result.stdout) == (1, "")
    assert message in result.stderr


def test_slurm_without_scontrol_says_so(bin_dir):
    result = run(bin_dir, SLURM, SLURM_JOB_NODELIST="node01")
    assert result.returncode == 1
    assert "scontrol not found" in result.stderr


def test_slurm_help_explains_where_hosts_and_slots_come_from(bin_dir):
    usage = run(bin_dir, SLURM, "--help")
    assert usage.returncode == 0
    assert "scontrol show hostnames" in usage.stdout and "SLURM_NTASKS_PER_NODE" in usage.stdout


# ------------------------------------------------------------------ as tensorflowrun runs them

def test_a_wrapper_script_feeds_tensorflowrun(bin_dir, tmp_path, monkeypatch):
    """tensorflowrun runs --discovery without arguments: a wrapper picks the flags."""
    FakeTool(bin_dir, "kubectl", stdout=pod("w-0", "10.0.0.10") + pod("w-1", "10.0.0.11"))
    wrapper = tmp_path / "discover.sh"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -m {KUBERNETES} -l app=train --slots 2\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    assert hosts.run_discovery(str(wrapper)) == {"10.0.0.10": 2, "10.0.0.11": 2}
    os.remove(bin_dir / "kubectl")
    with pytest.raises(RuntimeError, match="kubectl not found"):
        hosts.run_discovery(str(wrapper))
