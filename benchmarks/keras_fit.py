"""Steps/s of Keras `fit` under the elastic strategy against stock MultiWorkerMirroredStrategy.

    flock -o /tmp/tfe-heavy.lock .venv/bin/python benchmarks/keras_fit.py --runs 3

Both sides train the same tf-keras model (TF_USE_LEGACY_KERAS=1: stock MWMS
`fit` fails with Keras 3) on the same batched input,
`Dataset.range(N).map(make_example).batch(G)`, with 2 local workers: the
elastic side with `tfe.keras.fit_elastic` under an orchestrator (a commit
every batch), the stock side with `model.fit` under TF_CONFIG. Steps/s is
taken on worker 0 from the end of the first epoch (tracing and warm-up
excluded) to the end of training. Runs alternate the order of the two sides;
it prints each run and, last, the medians and the ratio as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKERS = 2


def _train(kind: str, epochs: int, examples: int, global_batch: int) -> None:
    """One worker of `kind` ("elastic" or "stock"); prints {"steps_per_s": ...} on worker 0."""
    import tensorflow as tf

    if kind == "elastic":
        import tensorflow_elastic as tfe

        runtime = tfe.init()
        strategy = tfe.ElasticMultiWorkerMirroredStrategy()
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    keras = tf.keras

    def make_example(i):
        x = tf.cast(i, tf.float32)
        features = tf.stack([tf.sin(x * k) for k in (0.1, 0.3, 0.7, 1.1, 1.3, 1.7, 1.9, 2.3)])
        return tf.tile(features, [8]), tf.sin(x * 0.5)

    dataset = tf.data.Dataset.range(examples).map(make_example).batch(global_batch)
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.01), "mse")
    steps_per_epoch = int(dataset.cardinality())
    marks: list[float] = []

    class Clock(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            marks.append(time.perf_counter())

    if kind == "elastic":
        state = tfe.KerasState(model, model.optimizer, epoch=0, batch=0)

        @tfe.run
        def train(state):
            tfe.keras.fit_elastic(model, state, dataset, epochs=epochs, callbacks=[Clock()],
                                  verbose=0)

        train(state)
        first = runtime.membership.rank == 0
    else:
        model.fit(dataset, epochs=epochs, callbacks=[Clock()], verbose=0)
        first = json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0
    if first:
        steps = (epochs - 1) * steps_per_epoch
        print(json.dumps({"steps_per_s": steps / (marks[-1] - marks[0])}), flush=True)
    sys.stdout.flush()
    os._exit(0)


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _env() -> dict[str, str]:
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    env.pop("TFE_EVENTS_FILE", None)
    return env


def _run(kind: str, args: argparse.Namespace, timeout: float = 600.0) -> float:
    """Steps/s of one job of `kind`; every process it starts is ended before it returns."""
    extra: list[subprocess.Popen] = []
    envs = []
    if kind == "elastic":
        orchestrator = subprocess.Popen(
            [sys.executable, "-m", "tensorflow_elastic.rendezvous", "--host", "127.0.0.1",
             "--port", "0", "--last_call", "1"], stdout=subprocess.PIPE, text=True, env=_env())
        extra.append(orchestrator)
        line = ""
        deadline = time.monotonic() + 30
        while "listening on " not in line and time.monotonic() < deadline:
            line = orchestrator.stdout.readline()
        endpoint = "127.0.0.1:" + line.rsplit(":", 1)[1].strip()
        # Keep reading what it prints, so that a full pipe never blocks it.
        threading.Thread(target=orchestrator.stdout.read, daemon=True).start()
        run_id = f"bench-{time.time()}"  # one job: the same run id for every worker
        envs = [dict(_env(), TFE_RDZV_ENDPOINT=endpoint, TFE_RUN_ID=run_id,
                     TFE_MIN_NODES=str(WORKERS), TFE_MAX_NODES=str(WORKERS))
                for _ in range(WORKERS)]
    else:
        workers = [f"127.0.0.1:{p}" for p in _free_ports(WORKERS)]
        envs = [dict(_env(), TF_CONFIG=json.dumps({"cluster": {"worker": workers},
                                                   "task": {"type": "worker", "index": i}}))
                for i in range(WORKERS)]
    command = [sys.executable, os.path.abspath(__file__), "--worker", kind,
               "--epochs", str(args.epochs), "--examples", str(args.examples),
               "--global_batch", str(args.global_batch)]
    procs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True, env=env) for env in envs]
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs + extra:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    for p, out in zip(procs, outputs):
        if p.returncode != 0:
            raise RuntimeError(f"a {kind} worker exited with {p.returncode}: {out[-2000:]}")
    results = [json.loads(line)["steps_per_s"] for out in outputs for line in out.splitlines()
               if line.startswith('{"steps_per_s"')]
    if len(results) != 1:
        raise RuntimeError(f"expected one result from the {kind} job, got {results}")
    return results[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--examples", type=int, default=12800)
    parser.add_argument("--global_batch", type=int, default=64)
    parser.add_argument("--worker", choices=["elastic", "stock"])
    args = parser.parse_args()
    if args.worker:
        _train(args.worker, args.epochs, args.examples, args.global_batch)
        return
    rates: dict[str, list[float]] = {"elastic": [], "stock": []}
    for run in range(args.runs):
        order = ["elastic", "stock"] if run % 2 == 0 else ["stock", "elastic"]
        for kind in order:
            rates[kind].append(_run(kind, args))
        print(f"run {run + 1}: elastic {rates['elastic'][-1]:.1f} steps/s, "
              f"stock {rates['stock'][-1]:.1f} steps/s", flush=True)
    ratios = [e / s for e, s in zip(rates["elastic"], rates["stock"])]
    print(json.dumps({
        "elastic_steps_per_s": round(statistics.median(rates["elastic"]), 2),
        "stock_steps_per_s": round(statistics.median(rates["stock"]), 2),
        "ratio": round(statistics.median(ratios), 4),
        "ratio_min": round(min(ratios), 4), "ratio_max": round(max(ratios), 4),
        "runs": args.runs}))


if __name__ == "__main__":
    main()
