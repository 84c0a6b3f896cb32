#!/usr/bin/env bash
# Runs the op tests and the kill-and-join job against the tensorflow_elastic
# installed in VENV (not the checkout's): the tests, their tools and the
# examples are copied to a directory without the package, so every import of
# tensorflow_elastic, in the tests and in the workers they start, finds the
# installed one. Installs pytest and its plugins into VENV (the versions of requirements.txt).
#
#   tools/test_installed.sh VENV
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:?usage: tools/test_installed.sh VENV}
TREE=$(mktemp -d /tmp/tfe-installed-tests.XXXXXX)
trap 'rm -rf "$TREE"' EXIT
"$VENV/bin/python" -m pip --disable-pip-version-check -q install \
  $(grep -E '^(pytest(-timeout|-xdist)?|execnet)==' requirements.txt) 2>&1 | { grep -v -E '^WARNING: Location .* is ignored' || true; }
cp -r tests tools examples pyproject.toml "$TREE"/
cd "$TREE"
"$VENV/bin/python" - <<'PY'
import os, tensorflow_elastic
assert "site-packages" in tensorflow_elastic.__file__, f"not the installed package: {tensorflow_elastic.__file__}"
print(f"testing {os.path.dirname(tensorflow_elastic.__file__)}")
PY
# The AddressSanitizer test builds an instrumented library from the checkout's sources (minutes):
# the main suite runs it once.
TF_CPP_MIN_LOG_LEVEL=2 "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
  tests/ops tests/launch/test_kill_and_join.py --deselect \
  tests/ops/test_collective_server.py::test_an_update_right_after_aborted_collectives_frees_nothing_they_still_use
