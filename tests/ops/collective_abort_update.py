"""One process of test_collective_server.py: collectives aborted while they wait on a peer, each
followed at once by a membership update of the running server, again and again.

argv: the op library to load (an AddressSanitizer build under the test), the rounds to run.
This process is task 1; task 0, the collective group's leader, is a socket that accepts
connections and never answers, so a collective's group resolution waits on a remote call
that only the abort ends. Every round: start a two-member all-reduce, abort it, update the
server to this process alone (the update replaces the collective executors whose aborted
calls may still be finishing), run a one-member all-reduce, and update back to two members.
Prints {"rounds": N, "errors": [...]} when done.
"""

import importlib.util
import json
import socket
import sys
import threading
import time

import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.framework import errors
from tensorflow.python.ops import collective_ops

from tensorflow_elastic import net
from tensorflow_elastic.strategy import cluster

LIBRARY, ROUNDS = sys.argv[1], int(sys.argv[2])
SELF = 1

tf.load_op_library(LIBRARY)
spec = importlib.util.spec_from_file_location("tensorflow_elastic._binding", LIBRARY)
binding = importlib.util.module_from_spec(spec)
spec.loader.exec_module(binding)

silent_leader = socket.socket()
silent_leader.bind(("127.0.0.1", 0))
silent_leader.listen(64)
own = net.hold_port("127.0.0.1")
pair = {0: f"127.0.0.1:{silent_leader.getsockname()[1]}",
        SELF: f"127.0.0.1:{own.getsockname()[1]}"}
alone = {SELF: pair[SELF]}
own.close()

cluster.configure(SELF)
ctx = context.context()
ctx.enable_collective_ops(cluster.server_def(pair, SELF))
ctx.ensure_initialized()
binding.forward_collectives(ctx._handle)


def update(members):
    binding.update_collective_server(ctx._handle,
                                     cluster.server_def(members, SELF).SerializeToString())


def all_reduce(group_size, group_key, instance_key):
    with tf.device(f"{cluster.task_device(SELF)}/device:CPU:0"):
        return collective_ops.all_reduce_v2(tf.constant([1.0, 2.0]), group_size, group_key,
                                            instance_key, merge_op="Add", final_op="Id")


seen = []
for round_ in range(ROUNDS):
    outcome = {}

    def waiting_on_the_leader():
        try:
            all_reduce(2, 100 + 2 * round_, 1)
            outcome["error"] = None
        except errors.OpError as e:
            outcome["error"] = type(e).__name__

    waiter = threading.Thread(target=waiting_on_the_leader)
    waiter.start()
    time.sleep(0.3)
    ctx.abort_collective_ops(errors.UNAVAILABLE, "the leader is gone")
    update(alone)
    waiter.join(60)
    seen.append(outcome.get("error", "still waiting"))
    assert all_reduce(1, 101 + 2 * round_, 1).numpy().tolist() == [1.0, 2.0]
    update(pair)
time.sleep(1.0)  # late callbacks of the aborted calls run meanwhile
print(json.dumps({"rounds": ROUNDS, "errors": sorted(set(seen))}), flush=True)
