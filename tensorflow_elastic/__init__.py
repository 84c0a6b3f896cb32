"""tensorflow_elastic: elastic, fault-tolerant multi-worker training for TensorFlow 2.x.

Importing the package checks the TensorFlow version from package metadata but
does not import TensorFlow itself: the orchestrator and the launcher never need
it. TensorFlow-facing parts load on first use.
"""

from __future__ import annotations

from tensorflow_elastic.tf_version import (REQUIRED_TF_VERSION, check_tensorflow_version,
                                           installed_tensorflow)

__version__ = "0.1.0"

# A wrong or doubled TensorFlow fails here, before anything else goes wrong.
# With no TensorFlow at all only the orchestrator and launcher work; the
# TensorFlow-facing parts run the check again when they load.
_installed_tensorflow = installed_tensorflow()
if _installed_tensorflow:
    check_tensorflow_version(_installed_tensorflow)

__all__ = ["REQUIRED_TF_VERSION", "__version__", "check_tensorflow_version"]
