"""tools/build_ops.py's decisions that need no compiler: the supported releases, the record."""

import json
import os

import pytest

from tools import build_ops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tensorflow(version: str) -> build_ops.TensorFlowBuild:
    return build_ops.TensorFlowBuild(version, "/include", (), ())


@pytest.mark.parametrize("version", ["2.20.0", "2.21.0", "2.21.3"])
def test_a_supported_release_is_built(version):
    build_ops.check_supported(ROOT, _tensorflow(version))


@pytest.mark.parametrize("version", ["2.19.1", "2.22.0"])
def test_another_release_is_refused_before_compiling(version):
    with pytest.raises(build_ops.BuildError, match=rf"TensorFlow {version} is installed, but "
                                                   r"tensorflow_elastic supports TensorFlow 2\.20 "
                                                   r"and 2\.21"):
        build_ops.check_supported(ROOT, _tensorflow(version))


def test_the_record_beside_the_library_names_the_tensorflow_it_was_built_for(tmp_path):
    path = build_ops.write_build_record(str(tmp_path / "_ops.so"), _tensorflow("2.20.0"))
    assert os.path.basename(path) == "_built_for.json"
    with open(path, encoding="utf-8") as f:
        assert json.load(f) == {"tensorflow": "2.20.0"}
