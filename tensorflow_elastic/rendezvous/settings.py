"""The orchestrator's flags, in a module of their own so the command, the server and the
saved state read them without importing the state machine."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class RunSettings:
    """Timing and limits of the state machine, the same for every run of an orchestrator."""

    heartbeat_timeout: float = 10.0
    last_call: float = 2.0
    below_min_timeout: float = 300.0
    probe_timeout: float = 1.0
    watch_loss_grace: float = 2.0
    blocklist_after: int = 2
    blocklist_cooldown: float = 10.0
    blocklist_max_cooldown: float = 600.0
    max_value_bytes: int = 64 * 1024
    history_size: int = 100
    # Limits of the orchestrator as a whole, against bad or hostile callers.
    run_expiry: float = 600.0
    max_runs: int = 1000
    max_watches_per_peer: int = 2000
    max_watches: int = 20_000
    # Barriers and exchanges one generation may hold (a worker uses a handful).
    max_gathers: int = 1000
