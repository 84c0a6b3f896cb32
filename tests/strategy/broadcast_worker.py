"""A worker of test_broadcast.py: one member of a real 3-process TensorFlow cluster.

argv: this node's id, then the members as JSON {id: "host:port"}. Broadcasts
variables of uneven dtypes and shapes (small chunks, so large ones travel in
several) from one source, then, in the next generation, from another; prints
each member's values as one JSON line per broadcast.
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
group_key = collectives.RuntimeInt(0, "group_key")
broadcaster = collectives.VariableBroadcaster(
    device, collectives.RuntimeInt(len(members), "group_size"), group_key, chunk_bytes=64)
# Traced ahead (as a joining node does), then used in the first broadcast.
broadcaster.prepare(variables, is_source=node_id != 1)
for generation, source in ((1, 1), (2, 0)):
    group_key.set(10 * generation)
    broadcaster.broadcast(variables, is_source=node_id == source)
    print(json.dumps({"generation": generation, "node": node_id,
                      "chunks": [len(broadcaster.chunks(v)) for v in variables],
                      "values": [v.numpy().tolist() for v in variables]}), flush=True)
