"""benchmarks/recovery.py --trace: a crash's recovery in phases, read from the survivors' step
records and "trace NAME TIME" lines."""

from __future__ import annotations

import queue

import pytest

from tests import benchmark_scripts


@pytest.fixture(scope="module")
def recovery():
    with benchmark_scripts.loaded("recovery") as module:
        yield module


class _Survivor:
    """What the phases read of a worker: its step records and its other stdout lines."""

    def __init__(self, node: int, steps: list[tuple[float, int]], traces: list[tuple[str, float]]):
        self.records = [{"t": t, "step": i + 1, "node": node, "generation": generation}
                        for i, (t, generation) in enumerate(steps)]
        self.lines: queue.Queue[str] = queue.Queue()
        for name, t in traces:
            self.lines.put(f"trace {name} {t}")
        self.lines.put("an unrelated line")


KILLED = 100.0


def _survivor(node: int, detected: float, formed: float, first_step: float) -> _Survivor:
    """Steps of 0.5 s until just before the kill, then a recovery, then steps of 0.25 s."""
    before = [(KILLED - 0.05 - 0.5 * i, 1) for i in reversed(range(12))]
    synced = formed + 0.002
    after = [(first_step + 0.25 * i, 2) for i in range(4)]
    traces = [("synchronize", KILLED - 3.0),  # an earlier generation's barrier
              ("_recover:in", detected), ("report_failure", detected + 0.004),
              ("restore", detected + 0.005), ("join", detected + 0.008),
              ("regroup", detected + 0.012), ("synchronize", formed), ("_recover", formed),
              ("sync", synced)]
    return _Survivor(node, before + after, traces)


def test_a_crash_is_split_into_phases_on_the_survivor_that_stepped_first(recovery):
    late = _survivor(1, detected=KILLED + 0.40, formed=KILLED + 0.42, first_step=KILLED + 0.95)
    early = _survivor(2, detected=KILLED + 0.30, formed=KILLED + 0.42, first_step=KILLED + 0.90)
    phases = recovery.crash_phases([late, early], KILLED, generation=1)
    assert phases["crash_detect_s"] == pytest.approx(0.30)
    assert phases["crash_go_back_s"] == pytest.approx(0.005)
    assert phases["crash_reform_s"] == pytest.approx(0.115)  # restored to the barrier
    assert phases["crash_sync_s"] == pytest.approx(0.002)
    assert phases["crash_first_step_s"] == pytest.approx(0.90 - 0.422)
    assert phases["crash_step_before_s"] == pytest.approx(0.5)
    assert phases["crash_step_after_s"] == pytest.approx(0.25)
    # The phases add up to the recovery figure (the kill to the first step).
    recovery_phases = ("crash_detect_s", "crash_go_back_s", "crash_reform_s", "crash_sync_s",
                       "crash_first_step_s")
    assert sum(phases[name] for name in recovery_phases) == pytest.approx(0.90)


def test_the_trace_lists_each_survivor_s_stages_after_the_kill(recovery):
    survivor = _survivor(3, detected=KILLED + 0.30, formed=KILLED + 0.32, first_step=KILLED + 0.8)
    text = recovery.crash_trace([survivor], KILLED)
    assert text.splitlines()[1] == (
        "  member 3: last step ended -50, _recover:in 300, report_failure 304, restore 305, "
        "join 308, regroup 312, synchronize 320, _recover 320, sync 322, first step 800")
