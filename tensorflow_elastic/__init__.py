"""tensorflow_elastic: elastic, fault-tolerant multi-worker training for TensorFlow 2.x.

Importing the package checks the TensorFlow version from package metadata but
does not import TensorFlow itself: the orchestrator and the launcher never need
it. TensorFlow-facing parts load on first use.
"""

from __future__ import annotations

import sys

from tensorflow_elastic.tf_version import (REQUIRED_TF_VERSION, check_tensorflow_version,
                                           installed_tensorflow)

__version__ = "0.1.0"

# A wrong or doubled TensorFlow fails here, before anything else goes wrong.
# With no TensorFlow at all only the orchestrator and launcher work; the
# TensorFlow-facing parts run the check again when they load.
_installed_tensorflow = installed_tensorflow()
if _installed_tensorflow:
    check_tensorflow_version(_installed_tensorflow)

# Public names and the module that defines each; loaded on first access.
_LAZY = {
    "init": "tensorflow_elastic.strategy.runtime",
    "run": "tensorflow_elastic.training.loop",
    "warm_up": "tensorflow_elastic.training.warm_up",
    "State": "tensorflow_elastic.training.state",
    "ObjectState": "tensorflow_elastic.training.state",
    "TensorFlowState": "tensorflow_elastic.training.state",
    "KerasState": "tensorflow_elastic.training.state",
    "Backup": "tensorflow_elastic.training.backup",
    "MembershipChanged": "tensorflow_elastic.errors",
    "ElasticJobFailed": "tensorflow_elastic.errors",
    "ElasticMultiWorkerMirroredStrategy": "tensorflow_elastic.strategy",
    "rank": "tensorflow_elastic.world",
    "size": "tensorflow_elastic.world",
    "local_rank": "tensorflow_elastic.world",
    "is_chief": "tensorflow_elastic.world",
}


# Submodules reachable as attributes (tfe.keras.fit_elastic) without an import of their own.
_SUBMODULES = {
    "data": "tensorflow_elastic.data",
    "keras": "tensorflow_elastic.training.keras",
    "ops": "tensorflow_elastic.ops",
    "ps": "tensorflow_elastic.ps",
}


def __getattr__(name: str):
    import importlib

    if name in _SUBMODULES:
        return importlib.import_module(_SUBMODULES[name])
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tensorflow_elastic' has no attribute '{name}'")
    return getattr(importlib.import_module(module), name)


if "tensorflow" in sys.modules:
    # The usual `import tensorflow as tf; import tensorflow_elastic` makes
    # tf.distribute.experimental.ElasticMultiWorkerMirroredStrategy available.
    import tensorflow_elastic.strategy  # noqa: F401

__all__ = ["REQUIRED_TF_VERSION", "__version__", "check_tensorflow_version", *_LAZY]
