"""deploy/grafana: the dashboard is JSON Grafana imports, and every metric its panels query
exists in the code (the orchestrator's and the agent's registries)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from tensorflow_elastic.launch.worker_metrics import WorkerMetrics
from tensorflow_elastic.rendezvous.metrics import Metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "tensorflow_elastic.json"
_METRIC = re.compile(r"\btfelastic_[a-z0-9_]+")
_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count",
                                                               "_created"), "gauge": ()}


def served_names() -> set[str]:
    """Every sample name the orchestrator's and the agent's metrics can serve."""
    names = set()
    for registry in (Metrics().registry, WorkerMetrics("run").registry):
        for family in registry.collect():
            names.add(family.name)
            names.update(family.name + suffix for suffix in _SUFFIXES[family.type])
    return names


def unknown_metrics(dashboard: dict) -> list[str]:
    known = served_names()
    queried = [name for panel in dashboard["panels"] for target in panel["targets"]
               for name in _METRIC.findall(target["expr"])]
    queried += _METRIC.findall(json.dumps(dashboard["templating"]))
    return sorted(set(queried) - known)


def test_the_dashboard_is_json_with_panels_that_query_something():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["panels"] and dashboard["uid"]
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        assert all(_METRIC.search(t["expr"]) for t in panel["targets"]), panel["title"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def test_every_metric_a_panel_queries_exists_in_the_code():
    assert unknown_metrics(json.loads(DASHBOARD.read_text())) == []


def test_a_renamed_metric_is_caught():
    broken = copy.deepcopy(json.loads(DASHBOARD.read_text()))
    broken["panels"][0]["targets"][0]["expr"] = "rate(tfelastic_worker_stepz[5m])"
    assert unknown_metrics(broken) == ["tfelastic_worker_stepz"]


@pytest.mark.parametrize("name", ["tfelastic_worker_steps_per_second", "tfelastic_worker_step",
                                  "tfelastic_worker_generation", "tfelastic_worker_world_size",
                                  "tfelastic_worker_recoveries_total",
                                  "tfelastic_worker_recovery_duration_seconds_bucket",
                                  "tfelastic_worker_lost_steps_total",
                                  "tfelastic_worker_sync_bytes_total"])
def test_the_dashboard_shows_every_worker_figure(name):
    assert name in DASHBOARD.read_text()
