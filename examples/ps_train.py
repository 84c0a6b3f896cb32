"""Asynchronous parameter-server training: one script, two roles.

    tfelastic-run --role ps --ps_address 127.0.0.1:7070 --ps_checkpoint_dir /tmp/ps-ckpt \\
        examples/ps_train.py --policy asypq --iterations 200
    tfelastic-run --role worker --ps_address 127.0.0.1:7070 --nproc_per_node 3 \\
        examples/ps_train.py --policy asypq --iterations 200

A small Keras regression model on synthetic data (no downloads); each worker
draws its own samples. Workers may come and go while the PS applies their
gradients in the order the policy chooses; a killed PS restarted by its
launcher resumes from the checkpoint and the workers reconnect.
"""

import argparse
import json
import os
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tensorflow_elastic import ps  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--policy", default="asypq", choices=ps.POLICIES)
parser.add_argument("--iterations", type=int, default=200,
                    help="per worker; the async PS stops after workers x iterations gradients")
parser.add_argument("--workers", type=int, default=3, help="workers the async total counts")
parser.add_argument("--synch_block_size", type=int, default=1)
parser.add_argument("--max_staleness", type=int, default=None)
parser.add_argument("--learning_rate", type=float, default=0.05, help="the PS's SGD step")
parser.add_argument("--batch", type=int, default=32)
parser.add_argument("--step_sleep", type=float, default=0.0,
                    help="seconds of extra work per gradient (makes a demo watchable)")
parser.add_argument("--straggler", type=float, default=1.0,
                    help="local worker 0 computes this many times slower")
parser.add_argument("--checkpoint_every", type=int, default=50)
parser.add_argument("--lease_timeout", type=float, default=10.0)
parser.add_argument("--result_file", help="a worker writes its result here as JSON")
args = parser.parse_args()

FEATURES = 16
true_w = np.random.RandomState(0).randn(FEATURES, 1).astype(np.float32)
keras.utils.set_random_seed(1)
model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(1)])
config = ps.PSConfig(policy=args.policy, iterations=args.iterations, workers=args.workers,
                     synch_block_size=args.synch_block_size, max_staleness=args.max_staleness)


def batches():
    """This worker's endless stream of samples (seeded by its slot and restart count)."""
    seed = int(os.environ.get("TFE_LOCAL_RANK", "0")) * 1000 + int(
        os.environ.get("TFE_RESTART_COUNT", "0"))
    rng = np.random.RandomState(seed)
    slow = args.straggler if os.environ.get("TFE_LOCAL_RANK", "0") == "0" else 1.0
    while True:
        x = rng.randn(args.batch, FEATURES).astype(np.float32)
        if args.step_sleep:
            time.sleep(args.step_sleep * slow)
        yield tf.constant(x), tf.constant(x @ true_w + 0.3)


loss_fn = keras.losses.MeanSquaredError()
result = ps.run(model=model, loss_fn=loss_fn, optimizer=keras.optimizers.SGD(args.learning_rate),
                dataset=batches(), config=config, checkpoint_every=args.checkpoint_every,
                lease_timeout=args.lease_timeout)
print(f"{os.environ.get(ps.ROLE_ENV)} done: {result}", flush=True)
if os.environ.get(ps.ROLE_ENV) == "ps":
    held_out = np.random.RandomState(12345).randn(1000, FEATURES).astype(np.float32)
    final = float(loss_fn(held_out @ true_w + 0.3, model(held_out)))
    print(f"final held-out loss {final:.4f} (policy {args.policy}, version {result['version']})",
          flush=True)
if args.result_file:
    with open(args.result_file, "w") as f:
        json.dump(result if isinstance(result, dict) else result.__dict__, f, default=str)
