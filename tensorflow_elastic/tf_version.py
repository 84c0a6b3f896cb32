"""The TensorFlow release this build works with, and the check at import.

The C++ op library links against TensorFlow's C++ ABI, which changes between
minor releases: a mismatch crashes or fails with unreadable symbol errors, so
we refuse early with a message that says what to do. The release is the one
the library was compiled against, which the build records
(tensorflow_elastic/_built_for.json); a source checkout built by install.sh has
the pinned one of requirements.txt. The check compares major.minor: patch
releases of one minor release keep its ABI and its Python internals
(docs/compatibility.md), so a 2.21.1 runs a library built for 2.21.0.
"""

from __future__ import annotations

import json
import os
from importlib import metadata

# Written by the wheel build next to this file: {"tensorflow": VERSION}.
BUILD_RECORD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_built_for.json")
PINNED_TF_VERSION = "2.21.0"  # requirements.txt's, which install.sh builds the checkout for
# The minor releases whose private internals the package was checked against (tf_internals.py).
SUPPORTED_RELEASES = ("2.20", "2.21")


def release(version: str) -> str:
    """The minor release ("2.21") of a TensorFlow version ("2.21.0", "2.21.0rc1")."""
    return ".".join(version.split(".")[:2])


def built_for(record: str = BUILD_RECORD) -> str:
    """The TensorFlow version the op library was built for."""
    try:
        with open(record, encoding="utf-8") as f:
            return str(json.load(f)["tensorflow"])
    except (OSError, ValueError, KeyError, TypeError):
        return PINNED_TF_VERSION


REQUIRED_TF_VERSION = built_for()

# Distributions that provide the `tensorflow` module.
TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-intel", "tensorflow-macos",
                    "tf-nightly", "tf-nightly-cpu")


class TensorFlowVersionError(ImportError):
    """The installed TensorFlow cannot run tensorflow_elastic."""


def installed_tensorflow() -> dict[str, str]:
    """Maps each installed TensorFlow distribution to its version."""
    found = {}
    for name in TF_DISTRIBUTIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def check_tensorflow_version(installed: dict[str, str] | None = None) -> str:
    """Returns the TensorFlow version, or raises TensorFlowVersionError saying what to fix.

    Reads package metadata only, so processes that never touch TensorFlow (the
    orchestrator) do not pay for importing it.
    """
    installed = installed_tensorflow() if installed is None else installed
    if not installed:
        raise TensorFlowVersionError(
            f"TensorFlow is not installed. tensorflow_elastic needs TensorFlow {REQUIRED_TF_VERSION}: "
            f"pip install 'tensorflow-cpu=={REQUIRED_TF_VERSION}' (or 'tensorflow[and-cuda]=="
            f"{REQUIRED_TF_VERSION}' for GPUs).")
    if len(installed) > 1:
        listing = ", ".join(f"{k}=={v}" for k, v in sorted(installed.items()))
        raise TensorFlowVersionError(
            f"Several TensorFlow distributions are installed ({listing}); they overwrite each "
            f"other's files. Uninstall all but one, then reinstall that one "
            f"(pip uninstall {' '.join(sorted(installed))}; pip install "
            f"'tensorflow-cpu=={REQUIRED_TF_VERSION}').")
    (name, version), = installed.items()
    if release(version) not in SUPPORTED_RELEASES:
        raise TensorFlowVersionError(
            f"tensorflow_elastic supports TensorFlow {' and '.join(SUPPORTED_RELEASES)}, but "
            f"{name}=={version} is installed: it relies on TensorFlow internals that other "
            f"releases may have changed (docs/compatibility.md). Install one of those "
            f"(pip install '{name}=={REQUIRED_TF_VERSION}').")
    if release(version) != release(REQUIRED_TF_VERSION):
        raise TensorFlowVersionError(
            f"tensorflow_elastic was built for TensorFlow {REQUIRED_TF_VERSION}, "
            f"but {name}=={version} is installed. Rebuild tensorflow_elastic against your "
            f"TensorFlow (pip install --force-reinstall --no-deps --no-cache-dir "
            f"<its source>, or ./install.sh in a checkout), or install the release it was "
            f"built for (pip install '{name}=={REQUIRED_TF_VERSION}').")
    return version
