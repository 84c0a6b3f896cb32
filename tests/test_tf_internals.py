"""The guard on TensorFlow's private internals, and docs/compatibility.md listing every one."""

import ast
import glob
import os
import re
import types

import pytest

from tensorflow_elastic import tf_internals
from tensorflow_elastic.tf_internals import TensorFlowInternalsError, private, require, require_read

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "tensorflow_elastic")
GUARDS = {"private", "require", "require_read"}
# TensorFlow's custom-op API (its guide's headers) and its C API: no entry in the docs needed.
PUBLIC_HEADERS = re.compile(
    r"tensorflow/core/framework/(op|op_kernel|shape_inference|common_shape_fns|tensor|tensor_shape"
    r"|partial_tensor_shape|types|register_types|resource_mgr|dataset)\.h|tensorflow/core/platform/"
    r"|tensorflow/c/eager/c_api\.h")


def _docs() -> str:
    with open(os.path.join(ROOT, "docs", "compatibility.md"), encoding="utf-8") as f:
        return f.read()


def _package_trees():
    for path in glob.glob(os.path.join(PACKAGE, "**", "*.py"), recursive=True):
        if not path.endswith(("_pb2.py", "_pb2_grpc.py")):
            with open(path, encoding="utf-8") as f:
                yield path, ast.parse(f.read())


def test_every_guarded_private_name_is_listed_in_the_docs():
    guarded = set()
    for _, tree in _package_trees():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in GUARDS):
                guarded.update(arg.value for arg in node.args
                               if isinstance(arg, ast.Constant) and isinstance(arg.value, str))
    assert "_variant_tensor" in guarded
    docs = _docs()
    assert sorted(name for name in guarded if f"`{name}" not in docs
                  and f".{name}`" not in docs and f"{name}`" not in docs) == []


def test_every_private_tensorflow_package_is_listed_in_the_docs():
    packages = set()
    for _, tree in _package_trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    ("tensorflow.python.", "tensorflow.core.")):
                packages.add(".".join(node.module.split(".")[:3]))  # tensorflow.python.distribute
    assert "tensorflow.python.distribute" in packages
    docs = _docs()
    assert sorted(p for p in packages if f"`{p}" not in docs) == []


def test_every_internal_cpp_header_is_listed_in_the_docs():
    headers = set()
    for path in glob.glob(os.path.join(ROOT, "cc", "**", "*.*"), recursive=True):
        with open(path, encoding="utf-8") as f:
            headers.update(re.findall(r'#include "(tensorflow/[^"]+)"', f.read()))
    internal = {h for h in headers if not PUBLIC_HEADERS.search(h)}
    assert "tensorflow/core/common_runtime/eager/context.h" in internal
    docs = _docs()
    assert sorted(h for h in internal if f"`{h}`" not in docs) == []


def test_a_missing_internal_is_named_with_the_supported_releases():
    fake = types.ModuleType("tensorflow.python.fake_ops")
    with pytest.raises(TensorFlowInternalsError,
                       match=r"private tensorflow\.python\.fake_ops\._Gone, which TensorFlow \S+ "
                             r"does not have; it was checked against TensorFlow 2\.20 and 2\.21"):
        private(fake, "_Gone")


def test_require_names_the_class_and_passes_what_is_there():
    class Base:
        def _kept(self):
            return None

    require(Base, "_kept")
    with pytest.raises(TensorFlowInternalsError, match=r"Base\._renamed"):
        require(Base, "_kept", "_renamed")


def test_require_read_notices_an_attribute_the_base_class_no_longer_reads():
    class Launcher:
        def __init__(self, key):
            self._key = key

        def run(self):
            return self._key

    require_read(Launcher, "_key")
    with pytest.raises(TensorFlowInternalsError, match=r"Launcher\._group_key"):
        require_read(Launcher, "_group_key")


def test_the_installed_tensorflow_has_every_internal_the_modules_check_when_they_load():
    import importlib

    for module in ("tensorflow_elastic.strategy.strategy", "tensorflow_elastic.strategy.collectives",
                   "tensorflow_elastic.data.batched", "tensorflow_elastic.training.keras"):
        importlib.import_module(module)
    assert tf_internals.SUPPORTED_RELEASES == ("2.20", "2.21")
