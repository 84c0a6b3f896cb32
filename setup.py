"""Wheel build: the Python package plus its built artefacts.

- the protobuf/gRPC modules, generated from tensorflow_elastic/proto/*.proto;
- the op library tensorflow_elastic/_ops.so (the kernels and the pybind11
  binding of variable snapshots and collective server updates): compiled here
  against the TensorFlow installed in the environment (tools/build_ops.py, its
  `tf.sysconfig` flags, no Bazel), or a prebuilt one from $TFE_OPS_LIBRARY
  (install.sh passes the one `bazel build //...` made);
- tensorflow_elastic/_built_for.json, the TensorFlow version the library was
  built for, which the import checks.

`pip install -v .` shows the compiler's progress (a few minutes on 2 cores).
"""

import os
import shutil
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, "tools"))

from build_ops import BuildError, build, probe_tensorflow, write_build_record  # noqa: E402
from gen_protos import generate  # noqa: E402

OPS_LIBRARY = "TFE_OPS_LIBRARY"  # tensorflow_elastic.environment.OPS_LIBRARY


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class BuildWithArtefacts(build_py):
    def run(self):
        super().run()
        generated = generate(ROOT, self.build_lib)
        log(f"generated {len(generated)} protobuf/gRPC modules")
        package = os.path.join(self.build_lib, "tensorflow_elastic")
        target = os.path.join(package, "_ops.so")
        try:
            tensorflow = probe_tensorflow()
            prebuilt = os.environ.get(OPS_LIBRARY)
            if prebuilt:
                if not os.path.exists(prebuilt):
                    raise BuildError(f"${OPS_LIBRARY}={prebuilt}: no such file")
                shutil.copyfile(prebuilt, target)
                log(f"copied the op library {prebuilt} -> {target}")
            else:
                import pybind11

                build(ROOT, target, tensorflow, pybind11.get_include(), log=log)
        except BuildError as e:
            raise SystemExit(f"error: {e}") from None
        os.chmod(target, 0o755)
        write_build_record(target, tensorflow)
        log(f"the op library is for TensorFlow {tensorflow.version}")


class BinaryDistribution(Distribution):
    """The wheel carries a compiled library, so it is platform-specific."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithArtefacts}, distclass=BinaryDistribution)
