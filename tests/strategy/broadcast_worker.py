"""A worker of test_broadcast.py: one member of a real 3-process TensorFlow cluster.

argv: this node's id, then the members as JSON {id: "host:port"}. Broadcasts
variables of uneven dtypes and shapes (small chunks, so large ones travel in
several) from one source, then, in the next generation, from another, both to
every member; then, after each member changed its scalar, from node 2 to node
1 only (a group of two without the collective leader, node 0), and from node 0
to every member again; prints each member's values as one JSON line per
broadcast.
"""

import json
import sys

import numpy as np
import tensorflow as tf

from tensorflow_elastic.strategy import cluster, collectives

node_id = int(sys.argv[1])
members = {int(k): v for k, v in json.loads(sys.argv[2]).items()}
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
# The last broadcast, to every member, also keeps node 0 (the collective leader, which
# resolves every group) up while the others resolve the group of generation 3.
for generation, source, receivers in ((1, 1, [0, 2]), (2, 0, [1, 2]), (3, 2, [1]), (4, 0, [1, 2])):
    if generation == 3:
        variables[4].assign(10.0 * node_id + 7)
    if node_id == source or node_id in receivers:
        broadcaster.broadcast(variables, node_id == source, 1 + len(receivers), 10 * generation)
    print(json.dumps({"generation": generation, "node": node_id,
                      "chunks": [len(broadcaster.chunks(v)) for v in variables],
                      "values": [v.numpy().tolist() for v in variables]}), flush=True)
