"""docs/reference/environment.md and the code agree on the TFE_* variables: every one the code
names is documented there, and every one any page names exists in the code."""

from __future__ import annotations

import os
import re

from tests.docs import markdown

REFERENCE = "docs/reference/environment.md"
_VARIABLE = re.compile(r"\bTFE_[A-Z0-9_]*[A-Z0-9]\b")
# Where the variables are read or set: the package, the C++ kernels, the build.
_CODE = [("tensorflow_elastic", (".py",)), ("cc", (".cc", ".h")), (".", ("setup.py",))]


def in_code() -> set[str]:
    found = set()
    for folder, endings in _CODE:
        root = os.path.join(markdown.REPO_ROOT, folder)
        if not os.path.isdir(root):   # a test tree without the C++ sources (Bazel's runfiles)
            continue
        walk = [(root, [], os.listdir(root))] if folder == "." else os.walk(root)
        for directory, _, files in walk:
            for name in files:
                if name.endswith(endings):
                    with open(os.path.join(directory, name), encoding="utf-8") as f:
                        found |= set(_VARIABLE.findall(f.read()))
    return found


def test_every_variable_of_the_code_is_documented():
    code = in_code()
    assert {"TFE_RDZV_ENDPOINT", "TFE_ONE_PASS_UPDATES", "TFE_OPS_LIBRARY"} <= code
    assert sorted(code - set(_VARIABLE.findall(markdown.read(REFERENCE)))) == []


def test_every_documented_variable_exists():
    code = in_code()
    unknown = [f"{page}: {name}" for page in markdown.pages()
               for name in sorted(set(_VARIABLE.findall(markdown.read(page))) - code)]
    assert unknown == []
