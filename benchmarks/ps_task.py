"""One process of the PS-policy benchmark (benchmarks/ps_policies.py starts them).

Role ps serves a small MLP, evaluates it on a fixed held-out set after every
update and writes the loss timeline and the master's stats as JSON. Role
worker trains on its own synthetic samples (--straggler computes --slowdown
times slower; --join_after makes it start that much later than the others; SIGTERM
makes it leave at its next iteration, as a preempted worker does). For the ingest measurement, role ingest_ps serves one
--params-sized variable and records when each update lands, and role pusher
pushes random gradients for it as fast as it can.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

FEATURES = 16
HIDDEN = 32


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("role", choices=["ps", "worker", "ingest_ps", "pusher"])
    p.add_argument("--address", required=True)
    p.add_argument("--policy", default="asypq")
    p.add_argument("--iterations", type=int, default=150)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--synch_block_size", type=int, default=1)
    p.add_argument("--learning_rate", type=float, default=0.05)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--straggler", action="store_true")
    p.add_argument("--step_s", type=float, default=0.02, help="simulated compute per gradient")
    p.add_argument("--slowdown", type=float, default=3.0)
    p.add_argument("--params", type=int, default=1_000_000)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--go_file", help="a worker starts training once this file exists")
    p.add_argument("--join_after", type=float, default=0.0,
                   help="seconds after the go file before this worker starts")
    p.add_argument("--out")
    p.add_argument("--events_file")
    return p.parse_args()


def teacher() -> np.ndarray:
    return np.random.RandomState(0).randn(FEATURES, 1).astype(np.float32)


def model_variables():
    import tensorflow as tf
    rng = np.random.RandomState(1)
    return [tf.Variable(rng.randn(FEATURES, HIDDEN).astype(np.float32) * 0.3),
            tf.Variable(np.zeros(HIDDEN, np.float32)),
            tf.Variable(rng.randn(HIDDEN, 1).astype(np.float32) * 0.3),
            tf.Variable(np.zeros(1, np.float32))]


def loss_fn(variables):
    import tensorflow as tf
    w1, b1, w2, b2 = variables
    target = tf.constant(teacher())

    def loss(x):
        prediction = tf.nn.relu(x @ w1 + b1) @ w2 + b2
        return tf.reduce_mean((prediction - tf.tanh(x @ target / FEATURES ** 0.5)) ** 2)

    return loss


def serve_until_done(server, out: str, **record) -> None:
    """Serves until the job ends, then writes ``record`` and the PS's stats to ``out``."""
    server.start()
    print(f"listening on {server.address}", flush=True)
    server.wait(600)
    stats = server.stats()
    server.stop()
    with open(out, "w") as f:
        json.dump({**record, "stats": stats}, f)


def serve(args: argparse.Namespace) -> None:
    import tensorflow as tf
    from tensorflow_elastic.ps import PSConfig, ParameterServer

    variables = model_variables()
    loss = tf.function(loss_fn(variables))
    held_out = tf.constant(np.random.RandomState(99).randn(1024, FEATURES).astype(np.float32))
    timeline = [(time.time(), 0, float(loss(held_out)))]
    config = PSConfig(policy=args.policy, iterations=args.iterations, workers=args.workers,
                      synch_block_size=args.synch_block_size)
    host, port = args.address.rsplit(":", 1)
    server = ParameterServer(variables, tf.keras.optimizers.SGD(args.learning_rate), config,
                             host=host, port=int(port), events_file=args.events_file,
                             on_update=lambda v: timeline.append(
                                 (time.time(), v, float(loss(held_out)))))
    serve_until_done(server, args.out, timeline=timeline)


def work(args: argparse.Namespace) -> None:
    import tensorflow as tf
    from tensorflow_elastic.ps import PSWorker

    variables = model_variables()
    loss = loss_fn(variables)

    @tf.function
    def gradient(x):
        with tf.GradientTape() as tape:
            value = loss(x)
        return value, tape.gradient(value, variables)

    delay = args.step_s * (args.slowdown if args.straggler else 1.0)
    rng = np.random.RandomState(1000 + args.rank)

    def batches():
        while True:
            time.sleep(delay)
            yield tf.constant(rng.randn(32, FEATURES).astype(np.float32))

    gradient(tf.constant(rng.randn(32, FEATURES).astype(np.float32)))  # trace before the start
    print("ready", flush=True)
    deadline = time.monotonic() + 300
    while args.go_file and not os.path.exists(args.go_file) and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(args.join_after)
    worker = PSWorker(args.address, variables, gradient)
    signal.signal(signal.SIGTERM, lambda signum, frame: worker.request_stop())
    worker.run(batches())


def serve_ingest(args: argparse.Namespace) -> None:
    import tensorflow as tf
    from tensorflow_elastic.ps import PSConfig, ParameterServer

    landed: list[float] = []
    host, port = args.address.rsplit(":", 1)
    server = ParameterServer([tf.Variable(np.zeros(args.params, np.float32))],
                             tf.keras.optimizers.SGD(0.01), PSConfig(policy="fifo"),
                             host=host, port=int(port),
                             on_update=lambda version: landed.append(time.time()))
    serve_until_done(server, args.out, landed=landed, bytes_per_gradient=args.params * 4)


def push(args: argparse.Namespace) -> None:
    from tensorflow_elastic.ps.client import PSClient

    gradient = [np.random.RandomState(args.rank).randn(args.params).astype(np.float32) * 1e-6]
    with PSClient(args.address) as client:
        version = client.register().version
        pushed, start = 0, time.monotonic()
        while time.monotonic() - start < args.seconds:
            reply = client.push(version, gradient)
            pushed += 1
            if reply.stop:
                break
        client.leave(finished=True)
    print(json.dumps({"pushed": pushed}), flush=True)


if __name__ == "__main__":
    arguments = parse()
    {"ps": serve, "worker": work, "ingest_ps": serve_ingest,
     "pusher": push}[arguments.role](arguments)
