#!/usr/bin/env bash
# Sets up tensorflow_elastic from a source checkout, offline apart from the
# package registries: .venv with the pinned dependencies, Bazel, the op
# library, the wheel in dist/, installed into .venv. Safe to rerun: each step
# is skipped when its inputs have not changed.
#
#   ./install.sh            set up or update
#   ./install.sh --force    redo every step
set -euo pipefail

cd "$(dirname "$0")"
ROOT=$(pwd)
VENV="$ROOT/.venv"
STAMPS="$VENV/.tfe-stamps"
PYTHON=${PYTHON:-python3}
FORCE=0
case "${1:-}" in
  --force) FORCE=1 ;;
  -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "install.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
esac

START=$(date +%s.%N)
step() { printf '\n==> %s\n' "$*"; }
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(date +%s.%N)"; }
fail() { echo "install.sh: error: $*" >&2; exit 1; }
trap 'echo "install.sh: failed at line $LINENO: $BASH_COMMAND" >&2' ERR

# A hash of files' contents, for skipping steps whose inputs did not change.
hash_of() { { find "$@" -type f ! -name '*_pb2.py' ! -name '*_pb2_grpc.py' ! -path '*/__pycache__/*' \
                -print0 2>/dev/null || true; } | sort -z | xargs -0 -r sha256sum | sha256sum | cut -c1-16; }
# pip, quiet but for errors (this machine's pip configuration warns about every missing mirror path).
pip_quiet() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@" 2>&1 | { grep -v -E '^WARNING: Location .* is ignored' || true; }; }
unchanged() { [ "$FORCE" = 0 ] && [ -f "$STAMPS/$1" ] && [ "$(cat "$STAMPS/$1")" = "$2" ]; }
stamp() { mkdir -p "$STAMPS"; echo "$2" > "$STAMPS/$1"; }
# Debian packages, as root or through sudo.
apt_install() {
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  command -v apt-get >/dev/null || fail "apt-get is not available; install the Debian packages $* or their equivalent"
  $sudo apt-get update -q >/dev/null || fail "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "$@" >/dev/null || fail "apt-get install $* failed"
}

step "Python environment ($VENV)"
command -v "$PYTHON" >/dev/null || fail "$PYTHON not found; install Python 3.10+ or set PYTHON=/path/to/python3"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || fail "Python 3.10+ is needed, $PYTHON is $("$PYTHON" --version)"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV" || fail "could not create $VENV (on Debian: apt-get install python3-venv)"
  echo "created $VENV"
fi
REQ_HASH=$(hash_of requirements.txt requirements-nodeps.txt)
if unchanged requirements "$REQ_HASH"; then
  echo "pinned dependencies already installed"
else
  echo "installing the pinned dependencies of requirements.txt (TensorFlow is large: a few minutes on a cold cache)"
  pip_quiet install -q --upgrade pip
  pip_quiet install -q --progress-bar off -r requirements.txt
  pip_quiet install -q --progress-bar off --no-deps -r requirements-nodeps.txt
  stamp requirements "$REQ_HASH"
fi
# The op library holds a Python binding, built against this interpreter's headers.
if ! "$VENV/bin/python" -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
  PYTHON_DEV=python$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')-dev
  echo "installing Debian's $PYTHON_DEV (Python's headers)"
  apt_install "$PYTHON_DEV"
fi

step "etcd (orchestrator replicas: --store etcd://; their tests and benchmarks)"
if command -v etcd >/dev/null; then
  echo "using $(etcd --version 2>/dev/null | head -n 1)"
else
  echo "installing Debian's etcd-server"
  apt_install etcd-server
fi

step "iptables (the network-fault tests and chaos.py --net_faults; optional)"
if command -v iptables >/dev/null; then
  echo "using $(iptables --version)"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing Debian's iptables"
  apt_install iptables
else
  echo "not installed: the packet-loss and partition tests skip (apt-get install iptables)"
fi

step "Bazel $(cat .bazelversion) (.bazelversion)"
# bazelisk runs the release of .bazelversion when it can fetch it; Debian's bazel-bootstrap (the
# same release) is the offline fallback. Either hands over to tools/bazel.
BAZEL=""
if command -v bazelisk >/dev/null && timeout 300 bazelisk version >/dev/null 2>&1; then
  BAZEL=bazelisk
elif command -v bazel >/dev/null && [ -d /usr/share/bazel/rules/java ]; then
  BAZEL=bazel
else
  echo "installing Debian's bazel-bootstrap and bazel-rules-java (offline-capable Bazel 4)"
  apt_install bazel-bootstrap bazel-rules-java
  BAZEL=bazel
fi
echo "using $BAZEL ($($BAZEL --version 2>/dev/null | tail -n 1))"

step "Op library (bazel build //...)"
BUILD_HASH=$(hash_of cc tensorflow_elastic/proto tools BUILD WORKSPACE .bazelrc .bazelversion requirements.txt)
if unchanged bazel "$BUILD_HASH" && [ -f bazel-bin/tensorflow_elastic/_ops.so ]; then
  echo "op library up to date"
else
  t=$(date +%s.%N)
  LOG="$STAMPS/bazel-build.log"
  mkdir -p "$STAMPS"
  if ! "$BAZEL" build --repo_env=PYTHON_BIN_PATH="$VENV/bin/python" //... > "$LOG" 2>&1; then
    grep -E 'ERROR|error:' "$LOG" | head -n 40 >&2 || cat "$LOG" >&2
    fail "bazel build //... failed; the whole log is in $LOG"
  fi
  stamp bazel "$BUILD_HASH"
  echo "built bazel-bin/tensorflow_elastic/_ops.so in $(elapsed "$t") s"
fi

step "Wheel (dist/) and its installation into .venv"
WHEEL_HASH=$(hash_of tensorflow_elastic setup.py pyproject.toml README.md bazel-bin/tensorflow_elastic/_ops.so)
if unchanged wheel "$WHEEL_HASH" && ls dist/tensorflow_elastic-*.whl >/dev/null 2>&1; then
  echo "wheel up to date and installed"
else
  t=$(date +%s.%N)
  rm -rf dist build
  TFE_OPS_LIBRARY="$ROOT/bazel-bin/tensorflow_elastic/_ops.so" \
    pip_quiet wheel -q --no-build-isolation --no-deps -w dist . || fail "building the wheel failed"
  WHEEL=$(ls dist/tensorflow_elastic-*.whl)
  pip_quiet install -q --no-deps --force-reinstall "$WHEEL" || fail "installing $WHEEL failed"
  rm -rf build
  (cd / && TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/python" -c 'import os, tensorflow_elastic; from tensorflow_elastic import ops
assert "site-packages" in tensorflow_elastic.__file__ and os.path.exists(ops.LIBRARY_PATH), tensorflow_elastic.__file__') \
    || fail "the installed wheel does not import; see the error above"
  stamp wheel "$WHEEL_HASH"
  echo "built and installed $WHEEL ($(du -k "$WHEEL" | cut -f1) KB) in $(elapsed "$t") s"
fi

step "Build artefacts in the source tree (tests and \`python -m\` from a checkout import it)"
install -m 755 bazel-bin/tensorflow_elastic/_ops.so tensorflow_elastic/_ops.so
"$VENV/bin/python" tools/gen_protos.py --out . | sed 's/^/generated /'

echo
echo "tensorflow_elastic is installed in $VENV ($(elapsed "$START") s)."
echo "Run the tests: .venv/bin/pytest   or   bazel test //..."
