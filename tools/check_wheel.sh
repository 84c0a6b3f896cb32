#!/usr/bin/env bash
# Installs dist/*.whl into a new venv holding only the pinned TensorFlow,
# checks that the package imports with its op library (kernels and Python
# binding) and generated code, then runs the op tests and the kill-and-join
# job against it (tools/test_installed.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
WHEEL=$(ls dist/tensorflow_elastic-*.whl)
TF_PIN=$(grep -E '^tensorflow-cpu==' requirements.txt)
VENV=$(mktemp -d /tmp/tfe-wheel-check.XXXXXX)
trap 'rm -rf "$VENV"' EXIT
python3 -m venv "$VENV"
pip_quiet() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" 2>&1 | { grep -v -E '^WARNING: Location .* is ignored' || true; }; }
pip_quiet install "$TF_PIN"
pip_quiet install "$WHEEL"
cd /
export TF_CPP_MIN_LOG_LEVEL=2
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import tensorflow as tf
import tensorflow_elastic
from tensorflow_elastic import ops
from tensorflow_elastic.ops.variable_snapshot import VariableSnapshot
from tensorflow_elastic.proto import rendezvous_pb2  # noqa: F401
dists = [d.metadata["Name"] for d in md.distributions() if d.metadata["Name"].lower().startswith(("tensorflow", "tf-", "tf_"))]
assert sorted(n.lower().replace("_", "-") for n in dists) == ["tensorflow-cpu", "tensorflow-elastic"], dists
start, size = (int(t) for t in ops.global_batch_slice(1, 10, 3, 0))
assert (start, size) == (10, 4), (start, size)
weights = tf.Variable([1.0])
snapshot = VariableSnapshot([weights], reported=tf.Variable([2.0], dtype=tf.float64))
assert snapshot.take() == (2.0,)
weights.assign([3.0])
assert snapshot.saved_values()[0].numpy().tolist() == [1.0]
print(f"wheel OK: {tensorflow_elastic.__file__}, op library and its binding loaded, distributions {sorted(dists)}")
PY
bash "$ROOT/tools/test_installed.sh" "$VENV"
