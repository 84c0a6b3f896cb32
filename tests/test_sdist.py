"""The sdist: it holds what building the wheel needs (MANIFEST.in), and a wheel built from it
installs and imports with its op library and generated modules.

The wheel is built with the checkout's op library ($TFE_OPS_LIBRARY) to keep the test short;
compiling from the sdist is what `pip install` of it does (tools/check_pip_install.sh compiles
from a clone with the same setup.py).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

from tensorflow_elastic import ops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NEEDED = ("setup.py", "pyproject.toml", "README.md", "tools/build_ops.py", "tools/gen_protos.py",
          "cc/python/collective_server.cc", "cc/kernels/variable_snapshot.h",
          "cc/ops/global_batch_slice_op.cc", "tensorflow_elastic/proto/rendezvous.proto",
          "tensorflow_elastic/tf_version.py")
SKIPPED = (".git", ".venv", "bazel-*", "build", "dist", "*.egg-info", "__pycache__")


def _run(argv: list[str], cwd: str, **env: str) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> str:
    source = tmp_path_factory.mktemp("source") / "tensorflow_elastic"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*SKIPPED), symlinks=True)
    out = tmp_path_factory.mktemp("sdist")
    _run([sys.executable, "-c", f"from setuptools import build_meta; "
                                f"build_meta.build_sdist({str(out)!r})"], cwd=str(source))
    (path,) = glob.glob(str(out / "*.tar.gz"))
    return path


def test_the_sdist_holds_the_sources_and_no_build_artefacts(sdist):
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert [n for n in NEEDED if n not in names] == []
    assert [n for n in names if n.endswith(("_pb2.py", "_pb2_grpc.py", ".so", "_built_for.json"))
            ] == []


def test_a_wheel_built_from_the_sdist_installs_and_imports(sdist, tmp_path):
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
          "-w", str(tmp_path / "wheels"), sdist], cwd=str(tmp_path),
         TFE_OPS_LIBRARY=ops.LIBRARY_PATH)
    (wheel,) = glob.glob(str(tmp_path / "wheels" / "*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("tensorflow_elastic/_ops.so", "tensorflow_elastic/_built_for.json",
                   "tensorflow_elastic/proto/rendezvous_pb2_grpc.py"):
        assert needed in names
    site = tmp_path / "site"
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
          wheel], cwd=str(tmp_path))
    out = _run([sys.executable, "-c", "import tensorflow_elastic as t; from tensorflow_elastic "
                "import ops; ops.load_binding(); print(t.__file__)"],
               cwd=str(tmp_path), PYTHONPATH=str(site), TF_CPP_MIN_LOG_LEVEL="3")
    assert out.strip().startswith(str(site))
