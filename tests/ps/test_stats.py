"""The master's counters."""

import json

from tensorflow_elastic.ps import stats
from tensorflow_elastic.ps.gradient import Gradient


def test_staleness_percentiles_are_nearest_rank():
    assert stats.percentile({}, 0.5) is None
    histogram = {0: 5, 1: 3, 4: 2}
    assert stats.percentile(histogram, 0.5) == 0
    assert stats.percentile(histogram, 0.6) == 1
    assert stats.percentile(histogram, 0.95) == 4


def test_a_tally_survives_its_json_state_and_summarises_staleness():
    tally = stats.Tally()
    tally.accept(Gradient("a", 0, [], samples=16, loss=0.5), window=2)
    tally.reject("b", stats.Rejected.STALE)
    tally.update([Gradient("a", 0, []), Gradient("a", 2, [])], version=3)
    restored = stats.Tally.from_state(json.loads(json.dumps(tally.state())))
    assert restored == tally  # staleness keys are ints again after the JSON round trip
    assert restored.staleness_summary() == {"histogram": {1: 1, 3: 1}, "median": 1, "p95": 3,
                                            "max": 3}
    assert restored.rejected[stats.Rejected.STALE] == 1 and restored.samples() == {"a": 16, "b": 0}
    assert stats.Tally().staleness_summary()["median"] is None
