"""The metrics reference and the code name the same metrics, both ways."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference" / "metrics.md"


def _in_code() -> set[str]:
    names = set()
    for path in (ROOT / "tensorflow_elastic").rglob("*.py"):
        names.update(re.findall(r"[\"'](tfelastic_[a-z_]+)[\"']", path.read_text()))
    return names


def _documented() -> set[str]:
    # A counter's samples carry prometheus_client's `_total` suffix; the code names it without.
    return {re.sub(r"_total$", "", name) for name in
            re.findall(r"^\| `(tfelastic_[a-z_]+)`", REFERENCE.read_text(), re.MULTILINE)}


def test_every_metric_of_the_code_is_in_the_reference():
    assert sorted(_in_code() - _documented()) == []


def test_every_documented_metric_exists():
    assert sorted(_documented() - _in_code()) == []
