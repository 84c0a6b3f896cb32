"""The manifests under deploy/kubernetes, loaded the way kubectl reads them (multi-document YAML)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import yaml

MANIFESTS = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
MANIFEST_FILES = sorted(MANIFESTS.glob("*.yaml"))


def load(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def find_resource(kind: str, name: str) -> dict:
    for path in MANIFEST_FILES:
        for doc in load(path):
            if doc["kind"] == kind and doc["metadata"]["name"] == name:
                return doc
    raise AssertionError(f"no {kind} {name} in {MANIFESTS}")


@pytest.fixture
def resource() -> Callable[[str, str], dict]:
    """resource(kind, name) is that object from the manifests (a fresh copy each call)."""
    return find_resource


@pytest.fixture
def load_manifest() -> Callable[[Path], list[dict]]:
    """load_manifest(path) is the file's objects."""
    return load


@pytest.fixture
def manifests_dir() -> Path:
    return MANIFESTS


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test that takes ``manifest_file`` runs once per file under deploy/kubernetes."""
    if "manifest_file" in metafunc.fixturenames:
        metafunc.parametrize("manifest_file", MANIFEST_FILES, ids=lambda path: path.name)
