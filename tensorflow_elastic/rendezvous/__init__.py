"""The orchestrator of elastic runs and its client.

Server side: server (gRPC) -> service (checks requests) -> run (the generation state machine:
calls, waits, timers; refusals says why it refuses a call; wake.py the wake-up its waiting
joins share), which keeps run_state (the state's pure transitions; saved via store), gathers,
liveness and blocklist; client.py calls it, and keepalive.py carries the heartbeats of all a
process's nodes on one stream. Member maps travel
as deltas against the map the client holds: member_deltas.py (digest, diff, apply, the maps
a run keeps), map_replies.py (their encoding in join replies and watch updates), packed_maps.py
(large maps compressed for the clients that read them).
A worker's side of membership (its session, phase and watchdog) lives in membership/.

>>> from tensorflow_elastic.rendezvous import Client, Orchestrator
>>> with Orchestrator("127.0.0.1", 0) as server:          # embedded, as --standalone does
...     c = Client(server.endpoint, run_id="job")
...     m = c.join(address="127.0.0.1:5000", min_nodes=1, max_nodes=2, timeout=60)

See docs/orchestrator.md for the protocol.
"""

from tensorflow_elastic.rendezvous.client import Client
from tensorflow_elastic.rendezvous.errors import (
    BlocklistedError, GenerationChangedError, InvalidArgumentError, JobCompleteError,
    NodeRemovedError, RendezvousError, RendezvousTimeoutError, RunFailedError)
from tensorflow_elastic.rendezvous.settings import RunSettings
from tensorflow_elastic.rendezvous.types import (
    HeartbeatInfo, Membership, MembershipUpdate, Phase, RunStatus)


def __getattr__(name: str):
    # The server side loads on first use: a worker, which only needs the client, starts sooner.
    if name == "Orchestrator":
        from tensorflow_elastic.rendezvous.server import Orchestrator

        return Orchestrator
    raise AttributeError(f"module 'tensorflow_elastic.rendezvous' has no attribute '{name}'")


__all__ = [
    "BlocklistedError", "Client", "GenerationChangedError", "HeartbeatInfo",
    "InvalidArgumentError", "JobCompleteError", "Membership", "MembershipUpdate", "NodeRemovedError", "Orchestrator", "Phase",
    "RendezvousError", "RendezvousTimeoutError", "RunFailedError", "RunSettings", "RunStatus",
]
