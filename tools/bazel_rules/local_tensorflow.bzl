"""Repository rule: the Python interpreter and the TensorFlow and pybind11 it has installed.

Offline by construction: it reads the headers and libtensorflow_framework of
the TensorFlow wheel installed for the interpreter PYTHON_BIN_PATH (default:
the workspace's .venv/bin/python, made by install.sh), the interpreter's own
headers and those of its pybind11 package, and exposes them with a Python
toolchain on that interpreter, so py_test targets run with the same
TensorFlow and Python the op library is built against.
"""

_PROBE = """
import sysconfig
import pybind11
import tensorflow as tf
print(sysconfig.get_paths()["include"])
print(pybind11.get_include())
print(tf.sysconfig.get_include())
print(tf.sysconfig.get_lib())
print(tf.__version__)
"""

_BUILD = """
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

package(default_visibility = ["//visibility:public"])

cc_library(
    name = "tensorflow_headers",
    hdrs = glob(["include/**"], exclude = ["include/**/*.py", "include/**/LICENSE*"]),
    includes = ["include", "include/external/farmhash_archive/src",
                "include/external/com_github_grpc_grpc/include"],
    defines = ["_GLIBCXX_USE_CXX11_ABI=1", "EIGEN_MAX_ALIGN_BYTES=64"],
)

cc_library(
    name = "tensorflow_framework",
    srcs = ["libtensorflow_framework.so.2"],
)

# Headers only: an extension module takes the Python C API from the interpreter that loads it.
cc_library(
    name = "python_headers",
    hdrs = glob(["python_include/**/*.h"]),
    includes = ["python_include"],
)

cc_library(
    name = "pybind11",
    hdrs = glob(["pybind11_include/pybind11/**/*.h"]),
    includes = ["pybind11_include"],
    deps = [":python_headers"],
)

py_runtime(
    name = "python3_runtime",
    interpreter_path = "{python}",
    python_version = "PY3",
)

py_runtime_pair(
    name = "runtime_pair",
    py3_runtime = ":python3_runtime",
)

toolchain(
    name = "python_toolchain",
    toolchain = ":runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)
"""

def _local_tensorflow_impl(ctx):
    python = ctx.os.environ.get("PYTHON_BIN_PATH", "")
    if not python:
        venv_python = ctx.path(Label("//:WORKSPACE")).dirname.get_child(".venv").get_child("bin").get_child("python")
        if venv_python.exists:
            python = str(venv_python)
    if not python:
        found = ctx.which("python3")
        python = str(found) if found else ""
    if not python:
        fail("No Python interpreter: run ./install.sh, or pass --repo_env=PYTHON_BIN_PATH=/path/to/python.")
    result = ctx.execute([python, "-c", _PROBE], quiet = True, environment = {"TF_CPP_MIN_LOG_LEVEL": "3"})
    if result.return_code != 0:
        lines = result.stderr.strip().splitlines()
        fail("%s lacks what the op library is built with (%s); run ./install.sh first." %
             (python, lines[-1] if lines else "exit code %d" % result.return_code))
    python_include, pybind11_include, include, lib, version = result.stdout.strip().splitlines()[-5:]
    ctx.symlink(python_include, "python_include")
    ctx.symlink(pybind11_include, "pybind11_include")
    ctx.symlink(include, "include")
    ctx.symlink(lib + "/libtensorflow_framework.so.2", "libtensorflow_framework.so.2")
    ctx.file("BUILD", _BUILD.replace("{python}", python))
    ctx.file("defs.bzl", "PYTHON_BIN = %r\nTF_VERSION = %r\n" % (python, version))

local_tensorflow = repository_rule(
    implementation = _local_tensorflow_impl,
    environ = ["PYTHON_BIN_PATH"],
    local = True,
)
