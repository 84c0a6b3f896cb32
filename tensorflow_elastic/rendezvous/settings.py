"""The orchestrator's flags, in a module of their own so the command, the server and the
saved state read them without importing the state machine."""

from __future__ import annotations

import dataclasses
import math

from tensorflow_elastic import environment

# How often a node heartbeats (TFE_HEARTBEAT_INTERVAL overrides it; a large run's join replies
# ask for a longer interval, see beat_interval_floor). With the default --heartbeat_timeout of
# 1.5 s a node must miss 6 beats in a row to be removed: a host that vanishes is removed at most
# 1.5 s after its last beat, while a healthy node on a loaded machine keeps a wide margin.
HEARTBEAT_INTERVAL_S = 0.25
# The beats a second one run asks of its nodes at most: a beat that comes on a stream of its own
# takes the orchestrator's one core about 0.2 ms (benchmarks/orchestrator_scale.py), so 2,000 a
# second leave it more than half free whatever the run's size. Up to 500 nodes beat at the default
# interval; a larger run's join replies ask its nodes to beat less often (beat_interval_floor)
# and the run gives their silence as many of those intervals (liveness_timeout).
RUN_BEATS_PER_S = 2000.0
# Beats a node sends per heartbeat timeout at least, whatever the run's size: it survives
# two lost or late beats.
BEATS_PER_TIMEOUT = 3.0
# Intervals asked of nodes are whole multiples of this: a run holds few distinct ones.
INTERVAL_STEP_S = 0.05

# Joins one JoinMany call may carry (a launcher's nodes): the client splits more over calls.
MAX_JOINS_PER_CALL = 1024


# How quickly a client reaches an orchestrator that is back (restarted on its state, or a new
# leader): its channel tries to reconnect at least this often, and its calls retry after at
# most CLIENT_RETRY_BACKOFF_MAX_S (see client.py).
CLIENT_RECONNECT_BACKOFF_MAX_S = 1.0
CLIENT_RETRY_BACKOFF_MAX_S = 2.0


def heartbeat_interval() -> float:
    """A node's heartbeat interval: TFE_HEARTBEAT_INTERVAL, or the default."""
    return environment.number(environment.HEARTBEAT_INTERVAL, HEARTBEAT_INTERVAL_S)


def beat_interval_floor(nodes: int) -> float:
    """The shortest interval a run of ``nodes`` asks of its nodes (a join reply says it): the
    beats the orchestrator reads grow no further than RUN_BEATS_PER_S with the run's size."""
    steps = math.ceil(nodes / RUN_BEATS_PER_S / INTERVAL_STEP_S - 1e-9)
    return round(steps * INTERVAL_STEP_S, 6)


def liveness_timeout(heartbeat_timeout: float, interval: float) -> float:
    """How long a node beating every ``interval`` may stay silent: --heartbeat_timeout, or
    BEATS_PER_TIMEOUT intervals where those are longer (a large run's slower beats)."""
    return max(heartbeat_timeout, BEATS_PER_TIMEOUT * interval)


@dataclasses.dataclass
class RunSettings:
    """Timing and limits of the state machine, the same for every run of an orchestrator."""

    heartbeat_timeout: float = 1.5
    last_call: float = 2.0
    below_min_timeout: float = 300.0
    probe_timeout: float = 1.0
    watch_loss_grace: float = 1.0
    blocklist_after: int = 2
    blocklist_cooldown: float = 10.0
    blocklist_max_cooldown: float = 600.0
    max_value_bytes: int = 64 * 1024
    history_size: int = 100
    # A first join of a completed run starts the next job with its run id (an orchestrator
    # shared by job after job); False: the orchestrator serves one job (embedded in its
    # launcher), and whoever comes after its end is told that the job is complete.
    restart_completed: bool = True
    # Limits of the orchestrator as a whole, against bad or hostile callers.
    run_expiry: float = 600.0
    max_runs: int = 1000
    max_watches_per_peer: int = 2000
    max_watches: int = 20_000
    # Barriers and exchanges one generation may hold (a worker uses a handful).
    max_gathers: int = 1000

    @property
    def reload_grace(self) -> float:
        """How long a run loaded from the store (after a restart or a failover) gives its nodes
        to be heard from: a client may need a reconnect and a retry pause before its next
        heartbeat gets through, and that must not count as silence."""
        return (self.heartbeat_timeout + CLIENT_RECONNECT_BACKOFF_MAX_S
                + CLIENT_RETRY_BACKOFF_MAX_S)
