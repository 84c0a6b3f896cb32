"""Builds the op library (cc/ops, cc/kernels, cc/python) with the C++ compiler, no Bazel.

It compiles against the TensorFlow installed for the Python interpreter that
runs the build, with that TensorFlow's own compile and link flags
(``tf.sysconfig``), so the library fits the environment it is installed into.
TensorFlow is probed in a subprocess with the interpreter's normal import path:
pip's isolated build environment hides the environment's packages, and
TensorFlow must not be a build dependency (that would be a second one).

    python tools/build_ops.py --out tensorflow_elastic/_ops.so
    python tools/build_ops.py --asan --out /tmp/asan/_ops.so   # AddressSanitizer build

An AddressSanitizer build instruments the library's own code (TensorFlow's is
not): the interpreter that loads it needs ``LD_PRELOAD`` of the compiler's
``libasan.so`` (``asan_runtime()``), since Python itself is not instrumented.

Beside the library it writes the TensorFlow version it was built for
(_built_for.json), which the package checks at import. A TensorFlow release
the package does not support (tensorflow_elastic/tf_version.py) is refused
before compiling: the library uses TensorFlow C++ internals
(docs/compatibility.md) that another release may have changed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import glob
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from typing import Sequence

SOURCES = ("cc/ops/*.cc", "cc/kernels/*.cc", "cc/python/*.cc")
WARNINGS = ("-Wno-deprecated-declarations", "-Wno-sign-compare")
OPTIMIZED = ("-O2", "-g0")
# Line tables, so that a report names the source line; frame pointers, so that it has a stack.
# The library shares objects with the uninstrumented TensorFlow, so it keeps their layout: absl
# lays some of its types out otherwise when it sees __SANITIZE_ADDRESS__.
SANITIZED = ("-fsanitize=address", "-U__SANITIZE_ADDRESS__", "-fno-omit-frame-pointer", "-O1",
             "-g1")

_PROBE = """
import json, tensorflow as tf
print(json.dumps({"version": tf.__version__, "include": tf.sysconfig.get_include(),
                  "compile": tf.sysconfig.get_compile_flags(),
                  "link": tf.sysconfig.get_link_flags()}))
"""


BUILD_RECORD = "_built_for.json"  # tensorflow_elastic.tf_version.BUILD_RECORD's name


class BuildError(RuntimeError):
    """The op library cannot be built here; the message says what to install or fix."""


@dataclasses.dataclass(frozen=True)
class TensorFlowBuild:
    """What a compiler needs of the installed TensorFlow."""

    version: str
    include: str
    compile_flags: tuple[str, ...]
    link_flags: tuple[str, ...]


def probe_tensorflow(python: str = sys.executable) -> TensorFlowBuild:
    """The TensorFlow that ``python`` imports outside any build isolation."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    done = subprocess.run([python, "-c", _PROBE], env=env, capture_output=True, text=True,
                          cwd=tempfile.gettempdir())
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise BuildError(f"the op library is built against the installed TensorFlow, but "
                         f"{python} cannot import it ({last}). Install it first, e.g. "
                         f"pip install tensorflow-cpu==2.21.0, then install this package.")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return TensorFlowBuild(found["version"], found["include"], tuple(found["compile"]),
                           tuple(found["link"]))


def _tf_version_module(root: str):
    """tensorflow_elastic/tf_version.py on its own: the package's __init__ must not run here."""
    spec = importlib.util.spec_from_file_location(
        "_tfe_tf_version", os.path.join(root, "tensorflow_elastic", "tf_version.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_supported(root: str, tf: TensorFlowBuild) -> None:
    """Raises BuildError for a TensorFlow release the package does not support."""
    tf_version = _tf_version_module(root)
    if tf_version.release(tf.version) not in tf_version.SUPPORTED_RELEASES:
        supported = " and ".join(tf_version.SUPPORTED_RELEASES)
        raise BuildError(f"TensorFlow {tf.version} is installed, but tensorflow_elastic supports "
                         f"TensorFlow {supported} (its op library uses TensorFlow internals "
                         f"that other releases may have changed; docs/compatibility.md): "
                         f"pip install 'tensorflow-cpu=={tf_version.PINNED_TF_VERSION}'")


def write_build_record(library: str, tf: TensorFlowBuild) -> str:
    """Writes, next to ``library``, the TensorFlow version it was built for; returns the path."""
    path = os.path.join(os.path.dirname(os.path.abspath(library)), BUILD_RECORD)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"tensorflow": tf.version}, f)
    return path


def compile_flags(root: str, tf: TensorFlowBuild, pybind11_include: str,
                  asan: bool = False) -> list[str]:
    python_include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(python_include, "Python.h")):
        raise BuildError(f"Python's headers are missing ({python_include}/Python.h), needed by "
                         f"the op library's Python binding: install python3-dev (Debian/Ubuntu) "
                         f"or python3-devel, or use a Python that has them")
    external = os.path.join(tf.include, "external")
    return [*tf.compile_flags, "-fPIC", *(SANITIZED if asan else OPTIMIZED), *WARNINGS, f"-I{root}",
            f"-I{external}/com_github_grpc_grpc/include", f"-I{external}/farmhash_archive/src",
            f"-I{python_include}", f"-I{pybind11_include}"]


def build(root: str, out: str, tf: TensorFlowBuild, pybind11_include: str,
          compiler: str | None = None, jobs: int | None = None, log=print,
          asan: bool = False, sources: Sequence[str] = SOURCES) -> str:
    """Compiles every source (``sources``: glob patterns under ``root``) in parallel, then
    links ``out``; returns ``out``.

    With ``asan`` the library is built with AddressSanitizer (see the module's docstring).
    """
    check_supported(root, tf)
    compiler = compiler or os.environ.get("CXX") or "g++"
    if shutil.which(compiler) is None:
        raise BuildError(f"no C++ compiler ({compiler} not found): install g++ (build-essential) "
                         f"or set CXX")
    files = sorted(p for pattern in sources for p in glob.glob(os.path.join(root, pattern)))
    flags = compile_flags(root, tf, pybind11_include, asan)
    jobs = jobs or os.cpu_count() or 1
    log(f"building the {'AddressSanitizer ' if asan else ''}op library against TensorFlow "
        f"{tf.version}: {len(files)} sources, "
        f"{jobs} at a time, about 15 s each ({compiler})")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tfe-ops-") as objects:
        def compile_one(source: str) -> str:
            obj = os.path.join(objects, os.path.relpath(source, root).replace(os.sep, "_") + ".o")
            _run([compiler, *flags, "-c", source, "-o", obj])
            return obj

        done = []
        pool = concurrent.futures.ThreadPoolExecutor(jobs)
        try:
            futures = {pool.submit(compile_one, s): s for s in files}
            for future in concurrent.futures.as_completed(futures):
                done.append(future.result())
                log(f"  [{len(done)}/{len(files)}] {os.path.relpath(futures[future], root)} "
                    f"({time.monotonic() - started:.0f} s)")
        finally:
            pool.shutdown(cancel_futures=True)  # after a failure, the rest is not compiled
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        link = ("-fsanitize=address",) if asan else ("-s",)
        _run([compiler, "-shared", *link, *sorted(done), "-o", out, *tf.link_flags])
    write_build_record(out, tf)
    log(f"built {out} in {time.monotonic() - started:.0f} s")
    return out


def asan_runtime(compiler: str | None = None) -> str:
    """The AddressSanitizer runtime of ``compiler``, for ``LD_PRELOAD`` of an ``asan`` build."""
    compiler = compiler or os.environ.get("CXX") or "g++"
    if shutil.which(compiler) is None:
        raise BuildError(f"no C++ compiler ({compiler} not found): install g++ or set CXX")
    found = subprocess.run([compiler, "-print-file-name=libasan.so"], capture_output=True,
                           text=True).stdout.strip()
    if not os.path.isabs(found) or not os.path.exists(found):
        raise BuildError(f"{compiler} has no AddressSanitizer runtime (libasan.so): install "
                         f"libasan (Debian: libgcc-12-dev) or use another compiler")
    return os.path.realpath(found)


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise BuildError(f"{shlex.join(argv[:1] + argv[-4:])} failed:\n"
                         + "\n".join(done.stderr.strip().splitlines()[-40:]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where to write the library")
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--asan", action="store_true",
                        help="build with AddressSanitizer (load it with LD_PRELOAD of libasan.so, "
                             "printed at the end)")
    args = parser.parse_args()
    import pybind11

    try:
        build(args.root, args.out, probe_tensorflow(), pybind11.get_include(), asan=args.asan)
        if args.asan:
            print(f"LD_PRELOAD={asan_runtime()}")
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
