"""The TensorFlow version pin and the clear refusal of a wrong installation."""

import os
import subprocess
import sys

import pytest

from tensorflow_elastic import tf_version
from tensorflow_elastic.tf_version import TensorFlowVersionError, check_tensorflow_version

REQUIRED = tf_version.REQUIRED_TF_VERSION
# The other supported minor release: refused, since the library was not built for it.
OTHER = "2.20.0" if tf_version.release(REQUIRED) == "2.21" else "2.21.0"


def test_matching_version_passes():
    assert check_tensorflow_version({"tensorflow-cpu": REQUIRED}) == REQUIRED


def test_the_installed_tensorflow_is_the_pinned_one():
    import tensorflow as tf

    assert tf.__version__ == REQUIRED
    assert check_tensorflow_version() == REQUIRED


def test_missing_tensorflow_says_what_to_install():
    with pytest.raises(TensorFlowVersionError, match=rf"pip install 'tensorflow-cpu=={REQUIRED}'"):
        check_tensorflow_version({})


def test_wrong_version_names_both_versions():
    with pytest.raises(TensorFlowVersionError, match=rf"built for TensorFlow {REQUIRED}.*{OTHER}"):
        check_tensorflow_version({"tensorflow": OTHER})


def test_wrong_version_says_to_rebuild():
    with pytest.raises(TensorFlowVersionError, match="Rebuild tensorflow_elastic against your "
                                                     "TensorFlow"):
        check_tensorflow_version({"tensorflow-cpu": OTHER})


def test_another_patch_release_of_the_same_minor_release_passes():
    patch = tf_version.release(REQUIRED) + ".7"
    assert check_tensorflow_version({"tensorflow-cpu": patch}) == patch


@pytest.mark.parametrize("version", ["2.19.0", "2.22.0", "3.0.0"])
def test_an_unsupported_release_is_refused_naming_the_supported_ones(version):
    with pytest.raises(TensorFlowVersionError, match=r"supports TensorFlow 2\.20 and 2\.21"):
        check_tensorflow_version({"tensorflow-cpu": version})


def test_two_distributions_are_refused():
    with pytest.raises(TensorFlowVersionError, match="Several TensorFlow distributions"):
        check_tensorflow_version({"tensorflow": REQUIRED, "tensorflow-cpu": REQUIRED})


def _import_in_subprocess(code, extra_path=None):
    env = dict(os.environ)
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [extra_path, env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)


def test_import_refuses_a_second_tensorflow_distribution(tmp_path):
    dist_info = tmp_path / "tensorflow-2.20.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorflow\nVersion: 2.20.0\n")
    result = _import_in_subprocess("import tensorflow_elastic", extra_path=str(tmp_path))
    assert result.returncode != 0
    assert "Several TensorFlow distributions" in result.stderr


def test_import_does_not_import_tensorflow():
    result = _import_in_subprocess(
        "import sys, tensorflow_elastic; print('tensorflow' in sys.modules)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_the_version_comes_from_the_build_record(tmp_path):
    record = tmp_path / "_built_for.json"
    assert tf_version.built_for(str(record)) == tf_version.PINNED_TF_VERSION  # a checkout
    record.write_text('{"tensorflow": "2.20.0"}')
    assert tf_version.built_for(str(record)) == "2.20.0"


def test_a_release_is_major_dot_minor():
    assert tf_version.release("2.21.0") == "2.21"
    assert tf_version.release("2.20.0rc1") == "2.20"


@pytest.mark.parametrize("extra", ["cpu", "gpu"])
def test_the_install_extras_take_exactly_the_supported_releases(extra):
    import tomllib

    from packaging.requirements import Requirement

    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "pyproject.toml"), "rb") as f:
        (spec,) = tomllib.load(f)["project"]["optional-dependencies"][extra]
    allowed = Requirement(spec).specifier
    for supported in tf_version.SUPPORTED_RELEASES:
        assert allowed.contains(f"{supported}.0") and allowed.contains(f"{supported}.9")
    major, minor = map(int, tf_version.SUPPORTED_RELEASES[-1].split("."))
    first_major, first_minor = map(int, tf_version.SUPPORTED_RELEASES[0].split("."))
    assert not allowed.contains(f"{major}.{minor + 1}.0")
    assert not allowed.contains(f"{first_major}.{first_minor - 1}.9")
