"""Suite-wide setup shared by every test directory."""

import os

import tensorflow_elastic

# Processes the tests start (orchestrators, launchers, workers) must import the
# same tensorflow_elastic as the test itself: the checkout under pytest, the
# runfiles tree under Bazel.
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(tensorflow_elastic.__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [_PACKAGE_ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
