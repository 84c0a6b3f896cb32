"""docs/reference/events.md names every event the code records, and only those."""

from __future__ import annotations

import re

from tensorflow_elastic.observability import events
from tensorflow_elastic.ps import master, server

from tests.docs import markdown

REFERENCE = "docs/reference/events.md"


def recorded() -> set[str]:
    """The events of the shared record, and the parameter server's own (its workers' arrivals
    and departures are recorded as node_joined and node_left)."""
    shared = {value for name, value in vars(events).items()
              if name.isupper() and isinstance(value, str)}
    return shared | {server.CHECKPOINT_SAVED, master.CONFIG_CHANGED, master.STOPPED}


def documented() -> set[str]:
    """The first column of the page's tables of events (those after the common fields')."""
    text = markdown.read(REFERENCE).split("## Membership", 1)[1]
    return {m.group(1) for line in markdown.prose_lines(text)
            if (m := re.match(r"^\| `([a-z_]+)` \|", line))}


def test_every_recorded_event_is_documented():
    assert "generation_start" in recorded()
    assert sorted(recorded() - documented()) == []


def test_every_documented_event_is_recorded():
    assert sorted(documented() - recorded()) == []
