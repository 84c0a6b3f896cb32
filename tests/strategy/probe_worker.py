"""A worker of test_peer_probe.py: node 0 of a TensorFlow cluster whose node 1 accepts
connections and never answers (a listening socket nobody serves: a host that hangs).

argv: the members as JSON {id: "host:port"}. Probes itself, then node 1, while a
thread of its own counts its turns; prints one JSON line: which peers answered, how
long the silent one's probe took, and how many turns the thread had meanwhile.
"""

import json
import sys
import threading
import time

from tensorflow_elastic.strategy import cluster

members = {int(k): v for k, v in json.loads(sys.argv[1]).items()}
cluster.configure(0)
cluster.start(members, 0)
turns = 0
stop = threading.Event()


def count() -> None:
    global turns
    while not stop.is_set():
        turns += 1
        time.sleep(0.01)


counter = threading.Thread(target=count, daemon=True)
counter.start()
answered = {}
for peer in (0, 1):
    start = time.monotonic()
    before = turns
    try:
        cluster.check_peer(peer, timeout_ms=1500)
        answered[peer] = True
    except Exception:  # noqa: BLE001 - any failure to answer
        answered[peer] = False
    took, during = time.monotonic() - start, turns - before
stop.set()
print(json.dumps({"answered": answered, "silent_probe_s": took, "turns_during": during,
                  "unreachable": cluster.unreachable_peers(members, 0, timeout_ms=500)}),
      flush=True)
