#!/usr/bin/env bash
# The install of a team that has its own TensorFlow environment: a fresh venv
# holding only tensorflow-cpu==VERSION, then `pip install <clone>` as a
# non-root user with no Bazel on PATH (the op library is compiled against that
# TensorFlow), then the op tests and the kill-and-join job against the
# installed package (tools/test_installed.sh). Prints how long each part took.
#
#   tools/check_pip_install.sh '2.20.*'
#
# Run as root, it does all of that as the system user tfe-ci (created with
# useradd if missing), with a Python that user can run: $CHECK_PYTHON, by
# default /usr/bin/python3 (root's own Python may lie where others cannot
# read it). If no such user can be created it says so and runs as root.
set -euo pipefail
cd "$(dirname "$0")/.."
TF_VERSION=${1:?usage: tools/check_pip_install.sh TENSORFLOW_VERSION (e.g. '2.20.*')}
CHECK_USER=tfe-ci

if [ -z "${TFE_CHECK_WORK:-}" ]; then
  # A clone of this checkout in a directory of its own, owned by whoever installs from it.
  WORK=$(mktemp -d /tmp/tfe-pip-check.XXXXXX)
  trap 'rm -rf "$WORK"' EXIT
  git clone -q --no-hardlinks "$(pwd)" "$WORK/src"
  if [ "$(id -u)" = 0 ]; then
    PY=${CHECK_PYTHON:-/usr/bin/python3}
    if id "$CHECK_USER" >/dev/null 2>&1 || useradd --system --no-create-home \
         --home-dir /nonexistent --shell /usr/sbin/nologin "$CHECK_USER"; then
      chown -R "$CHECK_USER:" "$WORK"
      runuser -u "$CHECK_USER" -- env TFE_CHECK_WORK="$WORK" HOME="$WORK" PYTHON="$PY" \
        bash "$WORK/src/tools/check_pip_install.sh" "$TF_VERSION"
      exit
    fi
    echo "check_pip_install.sh: cannot create the user $CHECK_USER: running as root" >&2
  fi
  TFE_CHECK_WORK="$WORK" bash "$WORK/src/tools/check_pip_install.sh" "$TF_VERSION"
  exit
fi

WORK=$TFE_CHECK_WORK
PY=${PYTHON:-python3}
pip_quiet() { "$WORK/venv/bin/python" -m pip --disable-pip-version-check -q "$@" 2>&1 | { grep -v -E '^WARNING: Location .* is ignored' || true; }; }
seconds_since() { echo $(( $(date +%s) - $1 )); }

t=$(date +%s)
"$PY" -m venv "$WORK/venv"
pip_quiet install --progress-bar off "tensorflow-cpu==$TF_VERSION"
echo "as $(id -un) (uid $(id -u)), $("$PY" --version): a venv with only" \
  "$("$WORK/venv/bin/python" -m pip list 2>/dev/null | grep -i '^tensorflow')" "in $(seconds_since "$t") s"

# Bazel must not be needed: stand-ins that fail come first on PATH.
mkdir -p "$WORK/no-bazel"
for tool in bazel bazelisk; do
  printf '#!/bin/sh\necho "%s was called: pip install must not need Bazel" >&2\nexit 1\n' "$tool" > "$WORK/no-bazel/$tool"
  chmod +x "$WORK/no-bazel/$tool"
done
export PATH="$WORK/no-bazel:$WORK/venv/bin:/usr/local/bin:/usr/bin:/bin"
t=$(date +%s)
pip_quiet install --progress-bar off "$WORK/src"
echo "pip install <clone> (compiles the op library) took $(seconds_since "$t") s"

t=$(date +%s)
bash "$WORK/src/tools/test_installed.sh" "$WORK/venv"
echo "tests against the installed package took $(seconds_since "$t") s"
