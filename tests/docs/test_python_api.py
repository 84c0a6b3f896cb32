"""docs/reference/python_api.md and the code agree: every public name has a heading there, and
every heading names something that exists."""

from __future__ import annotations

import importlib
import re

import tensorflow_elastic

from tests.docs import markdown

PAGE = "docs/reference/python_api.md"
# A heading that documents a name: "### `tfe.keras.fit_elastic(model, ...)`".
_DOCUMENTED = re.compile(r"^#{2,6}\s+`([A-Za-z_][\w.]*)")
# The modules whose public names the page must cover, as the page writes them.
MODULES = {"tfe": "tensorflow_elastic", "tfe.keras": "tensorflow_elastic.training.keras",
           "tfe.data": "tensorflow_elastic.data", "tfe.ps": "tensorflow_elastic.ps",
           "tfe.ops": "tensorflow_elastic.ops"}


def documented() -> set[str]:
    return {m.group(1) for line in markdown.prose_lines(markdown.read(PAGE))
            if (m := _DOCUMENTED.match(line))}


def public_names(prefix: str, module_name: str) -> set[str]:
    """`__all__`, or else every public class and function the module defines itself."""
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None)
    if names is None:
        names = [name for name, value in vars(module).items() if not name.startswith("_")
                 and getattr(value, "__module__", None) == module_name]
    return {f"{prefix}.{name}" for name in names}


def resolve(name: str):
    """The object a documented name stands for (``tfe.`` is ``tensorflow_elastic.``)."""
    parts = name.split(".")
    if parts[0] == "tfe":
        parts[0] = "tensorflow_elastic"
    for split in range(len(parts), 0, -1):   # the longest importable module, then attributes
        try:
            found = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            found = getattr(found, attribute)
        return found
    raise ImportError(name)


def test_every_public_name_is_documented():
    required = set().union(*(public_names(p, m) for p, m in MODULES.items()))
    assert "tfe.init" in required and "tfe.keras.fit_elastic" in required
    assert sorted(required - documented()) == []


def test_every_documented_name_exists():
    missing = []
    for name in sorted(documented()):
        try:
            resolve(name)
        except (ImportError, AttributeError):
            missing.append(name)
    assert missing == []


def test_submodules_the_page_covers_are_the_package_s():
    assert {f"tfe.{name}" for name in tensorflow_elastic._SUBMODULES} == set(MODULES) - {"tfe"}
