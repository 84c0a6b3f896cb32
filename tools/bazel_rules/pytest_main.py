"""Entry point of every py_test: runs pytest on the test files given as arguments."""

import os
import sys

import pytest

if __name__ == "__main__":
    # Bazel owns caching and temporary directories; pytest's cache would write into runfiles.
    # Bazel runs one file per target and schedules the targets itself: one process each.
    args = ["-p", "no:cacheprovider", "-q", "-n0", *sys.argv[1:]]
    xml = os.environ.get("XML_OUTPUT_FILE")
    if xml:
        args.append(f"--junitxml={xml}")
    sys.exit(pytest.main(args))
