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
import statistics
import subprocess
import sys
import time

from harness import Orchestrator, child_env, end, free_port, tf_config

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


def _env(**extra: str) -> dict[str, str]:
    return child_env("2", unset=("TFE_EVENTS_FILE",), TF_USE_LEGACY_KERAS="1", **extra)


def _run(kind: str, args: argparse.Namespace, timeout: float = 600.0) -> float:
    """Steps/s of one job of `kind`; every process it starts is ended before it returns."""
    orchestrator = None
    if kind == "elastic":
        orchestrator = Orchestrator("--last_call", "1", env=_env())
        run_id = f"bench-{time.time()}"  # one job: the same run id for every worker
        envs = [_env(TFE_RDZV_ENDPOINT=orchestrator.endpoint, TFE_RUN_ID=run_id,
                     TFE_MIN_NODES=str(WORKERS), TFE_MAX_NODES=str(WORKERS))
                for _ in range(WORKERS)]
    else:
        workers = [f"127.0.0.1:{free_port()}" for _ in range(WORKERS)]
        envs = [_env(TF_CONFIG=tf_config(workers, i)) for i in range(WORKERS)]
    command = [sys.executable, os.path.abspath(__file__), "--worker", kind,
               "--epochs", str(args.epochs), "--examples", str(args.examples),
               "--global_batch", str(args.global_batch)]
    procs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True, env=env) for env in envs]
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            end(p)
        if orchestrator is not None:
            orchestrator.stop()
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
