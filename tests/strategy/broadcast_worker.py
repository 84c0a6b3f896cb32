"""A worker of test_broadcast.py: one member of a real 4-process TensorFlow cluster.

argv: this node's id, the members as JSON {id: "host:port"}, a directory to
share files in. Broadcasts variables of uneven dtypes and shapes (small chunks,
so large ones travel in several) from one source, then, in the next
generation, from another, both to every member; then, after each member
changed its scalar, from node 2 to node 1 only (a pair without the collective
leader, node 0), and from node 0 to each other member in turn; prints each
member's values as one JSON line per broadcast. Last, node 0 sends to nodes 1,
2 and 3 in turn while node 1 holds a variable of another shape: node 1 writes a
file when its transfer fails, and on seeing it the others abort their
collectives, as the runtime does when the generation ends; each prints the
error it got.
"""

import json
import os
import sys
import threading
import time

import numpy as np
import tensorflow as tf

from tensorflow_elastic.strategy import cluster, collectives

node_id = int(sys.argv[1])
members = {int(k): v for k, v in json.loads(sys.argv[2]).items()}
failed_file = os.path.join(sys.argv[3], "node-1-failed")
cluster.configure(node_id)
cluster.start(members, node_id)
device = f"{cluster.task_device(node_id)}/device:CPU:0"
rng = np.random.RandomState(node_id)
with tf.device(device):
    variables = [tf.Variable(rng.randn(37, 5).astype(np.float32)),
                 tf.Variable(rng.randn(3).astype(np.float64)),
                 tf.Variable(rng.randint(0, 100, size=(2, 2, 2)).astype(np.int64)),
                 tf.Variable(rng.rand(6) > 0.5),
                 tf.Variable(float(node_id)),
                 tf.Variable(tf.zeros([0, 4])),
                 tf.Variable(rng.randn(2, 1000).astype(np.float16))]
broadcaster = collectives.VariableBroadcaster(device, chunk_bytes=64)
# Traced and instantiated ahead (as a joining node does), then used in the first broadcast.
broadcaster.prepare(variables, is_source=node_id != 1)


def report(generation):
    print(json.dumps({"generation": generation, "node": node_id,
                      "chunks": [len(broadcaster.chunks(v)) for v in variables],
                      "values": [v.numpy().tolist() for v in variables]}), flush=True)


for generation, source in ((1, 1), (2, 0)):
    broadcaster.broadcast(variables, node_id == source, len(members), 10 * generation)
    report(generation)
# Generation 4 also keeps node 0 (the collective leader, which resolves every group) up while
# the others resolve the pair of generation 3.
for generation, source, receivers in ((3, 2, [1]), (4, 0, [1, 2, 3])):
    if generation == 3:
        variables[4].assign(10.0 * node_id + 7)
    broadcaster.broadcast_in_pairs(variables, node_id, source, receivers, generation)
    report(generation)


def abort_when_node_1_failed():
    deadline = time.monotonic() + 60
    while not os.path.exists(failed_file) and time.monotonic() < deadline:
        time.sleep(0.05)
    cluster.abort_collectives("node 1 left")


if node_id == 1:
    with tf.device(device):
        variables[0] = tf.Variable(tf.zeros([7]))
else:
    threading.Thread(target=abort_when_node_1_failed, daemon=True).start()
try:
    broadcaster.broadcast_in_pairs(variables, node_id, 0, [1, 2, 3], 5)
    error = message = None
except tf.errors.OpError as e:
    error = type(e).__name__
    message = next((line for line in e.message.splitlines() if "aborted by" in line), e.message)
    if node_id == 1:
        open(failed_file, "w").close()
print(json.dumps({"generation": 5, "node": node_id, "error": error, "message": message}),
      flush=True)
