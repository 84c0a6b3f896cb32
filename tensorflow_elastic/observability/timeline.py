"""A job's history from its events file: world size and steps over time, failures, recoveries.

Every part writes its own view of an incident (the orchestrator, the agent
and each surviving worker each record a ``failure_detected``), so events
close in time are merged into one incident. A recovery ends at the first
``step`` event after the next ``generation_start``; steps come only as often
as the script records them, so recovery times are upper bounds at that
resolution.
"""

from __future__ import annotations

import dataclasses

from tensorflow_elastic.observability import events

# failure_detected events this close together describe one incident.
INCIDENT_WINDOW_S = 5.0


@dataclasses.dataclass
class Incident:
    time: float
    failed: list[int]
    cause: str
    recovered_at: float | None = None
    steps_before: int | None = None
    steps_after: int | None = None
    lost_steps: int | None = None

    @property
    def recovery_s(self) -> float | None:
        return None if self.recovered_at is None else self.recovered_at - self.time


@dataclasses.dataclass
class Timeline:
    start: float
    world: list[tuple[float, int]]
    steps: list[tuple[float, int]]
    joins: list[tuple[float, int]]
    incidents: list[Incident]
    completed: bool
    final_step: int | None = None
    generation: int | None = None
    members: list[int] = dataclasses.field(default_factory=list)

    def step_rates(self) -> list[tuple[float, float]]:
        """(time, steps/s) between consecutive recorded steps of the job."""
        rates = []
        for (t0, s0), (t1, s1) in zip(self.steps, self.steps[1:]):
            if t1 > t0 and s1 >= s0:
                rates.append((t1, (s1 - s0) / (t1 - t0)))
        return rates


def load(path: str) -> Timeline:
    """Reads an events file into a :class:`Timeline` (raises ValueError if it holds no events)."""
    entries = sorted(events.read_events(path), key=lambda e: e.get("time", 0.0))
    if not entries:
        raise ValueError(f"{path} holds no events; pass the file given to --events_file")
    start = entries[0]["time"]
    world: list[tuple[float, int]] = []
    seen_generations: set[int] = set()
    steps: list[tuple[float, int]] = []
    joins: list[tuple[float, int]] = []
    incidents: list[Incident] = []
    restored: list[dict] = []
    joined: set[int] = set()
    completed = False
    final_step = None
    generation, members = None, []
    for e in entries:
        kind, t = e.get("event"), e["time"]
        if completed and kind in (events.GENERATION_START, events.RENDEZVOUS_COMPLETE):
            continue  # members leaving after the exit barrier: the job's world is over
        if kind in (events.GENERATION_START, events.RENDEZVOUS_COMPLETE) and "world_size" in e:
            if e.get("generation") not in seen_generations:
                seen_generations.add(e.get("generation"))
                world.append((t, int(e["world_size"])))
                generation, members = e.get("generation"), sorted(e.get("members") or [])
        elif kind == events.STEP and isinstance(e.get("step"), int):
            # Several workers record the same global step: keep the job's furthest step,
            # except for the first step after an incident (a resume from a backup may be lower).
            resumed = bool(incidents and steps) and steps[-1][0] <= incidents[-1].time <= t
            if not steps or e["step"] > steps[-1][1] or resumed:
                steps.append((t, e["step"]))
        elif kind == events.NODE_JOINED and e.get("node") is not None \
                and e["node"] not in joined:
            # A node that registers first and joins later is recorded twice; it joined once.
            joined.add(e["node"])
            joins.append((t, e["node"]))
        elif kind == events.FAILURE_DETECTED:
            if incidents and t - incidents[-1].time <= INCIDENT_WINDOW_S:
                incidents[-1].failed = sorted(set(incidents[-1].failed) | set(e.get("failed") or []))
            else:
                incidents.append(Incident(t, sorted(e.get("failed") or []), str(e.get("cause", ""))))
        elif kind == events.STATE_RESTORED:
            restored.append(e)
        elif kind == events.JOB_COMPLETE:
            completed = True
            if isinstance(e.get("step"), int):
                final_step = max(final_step or 0, e["step"])
    for incident in incidents:
        _measure(incident, world, steps, restored)
    if final_step is None and steps:
        final_step = steps[-1][1]
    return Timeline(start, world, steps, joins, incidents, completed, final_step, generation,
                    members)


def _measure(incident: Incident, world: list[tuple[float, int]], steps: list[tuple[float, int]],
             restored: list[dict]) -> None:
    before = [s for t, s in steps if t <= incident.time]
    incident.steps_before = before[-1] if before else None
    regroup = next((t for t, _ in world if t > incident.time), incident.time)
    after = [(t, s) for t, s in steps if t > regroup]
    if after:
        incident.recovered_at, incident.steps_after = after[0]
    lost = [e["lost_steps"] for e in restored
            if "lost_steps" in e and incident.time <= e["time"] <= (incident.recovered_at or e["time"])]
    if lost:
        incident.lost_steps = max(lost)
    elif incident.steps_before is not None and incident.steps_after is not None:
        incident.lost_steps = max(0, incident.steps_before - incident.steps_after)


def summary(timeline: Timeline) -> str:
    """A few lines: duration, final world size, each incident's recovery time and lost steps."""
    end = max([t for t, _ in timeline.steps] + [t for t, _ in timeline.world] + [timeline.start])
    first_world = timeline.world[0][0] if timeline.world else timeline.start
    later = sum(1 for t, _ in timeline.joins if t > first_world)
    lines = [f"job {'completed' if timeline.completed else 'did not complete'} after "
             f"{end - timeline.start:.1f} s; last step {timeline.final_step}; world size "
             f"{' -> '.join(str(w) for _, w in timeline.world) or 'unknown'}; "
             f"{len(timeline.joins)} node(s) joined ({len(timeline.joins) - later} at the start, "
             f"{later} later), {len(timeline.incidents)} failure(s)"]
    for i, incident in enumerate(timeline.incidents, 1):
        recovery = "not recovered" if incident.recovery_s is None \
            else f"recovered in <= {incident.recovery_s:.2f} s"
        lost = "unknown" if incident.lost_steps is None else str(incident.lost_steps)
        lines.append(f"  failure {i} at +{incident.time - timeline.start:.1f} s "
                     f"(nodes {incident.failed or '?'}): {recovery}, lost steps {lost}")
    return "\n".join(lines)
