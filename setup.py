"""Wheel build: the Python package plus two built artefacts.

- the protobuf/gRPC modules, generated from tensorflow_elastic/proto/*.proto;
- the op library tensorflow_elastic/_ops.so (the kernels and the pybind11
  binding of variable snapshots and collective server updates), built by
  Bazel beforehand (install.sh runs
  `bazel build //...`); TFE_OPS_LIBRARY overrides its path.
"""

import os
import shutil
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, "tools"))

from gen_protos import generate  # noqa: E402

DEFAULT_OPS_LIBRARY = os.path.join(ROOT, "bazel-bin", "tensorflow_elastic", "_ops.so")


class BuildWithArtefacts(build_py):
    def run(self):
        super().run()
        generated = generate(ROOT, self.build_lib)
        print(f"generated {len(generated)} protobuf/gRPC modules")
        library = os.environ.get("TFE_OPS_LIBRARY", DEFAULT_OPS_LIBRARY)
        if not os.path.exists(library):
            raise SystemExit(f"error: op library {library} not found; build it first with "
                             f"`bazel build //...` (install.sh does) or set TFE_OPS_LIBRARY")
        target = os.path.join(self.build_lib, "tensorflow_elastic", "_ops.so")
        shutil.copyfile(library, target)
        os.chmod(target, 0o755)
        print(f"copied op library {library} -> {target}")


class BinaryDistribution(Distribution):
    """The wheel carries a compiled library, so it is platform-specific."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithArtefacts}, distclass=BinaryDistribution)
