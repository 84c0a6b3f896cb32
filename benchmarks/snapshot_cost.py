"""What a commit's snapshot costs, in one process, for models of several sizes.

For each size it measures, side by side in alternating blocks:

* take: `VariableSnapshot.take()` (one call into the pybind11 binding; what a
  commit does);
* eager read: one eager `_ReadVariablesOp` of the same variables (the previous
  way, kept here as the baseline);
* update step: a traced SGD-like update of every variable, without a snapshot
  held and right after a take. After a take the update copies each buffer
  (copy-on-write), which is the part of a commit's cost that grows with the
  model;
* held memory: how much the process's RSS grows when the first update after a
  take copies the buffers (the second copy a snapshot keeps).

The update after a take runs the library's one-pass kernels (old - delta
written once into a new buffer). With --rounds N the whole measurement runs
in 2N child processes that alternate between those kernels and TensorFlow's
two passes (TFE_ONE_PASS_UPDATES=0: copy the buffer, then update the copy),
and the copy-on-write of both is printed side by side.

Prints a table and, as its last line, JSON with the medians per size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from harness import durations, status_mb

import tensorflow as tf
from tensorflow.python.eager import context, execute

from tensorflow_elastic.ops.variable_snapshot import VariableSnapshot

# name -> shapes of the variables (float32)
SIZES = {
    "mlp_25KB": [(32, 64), (64,), (64, 64), (64,), (64, 1), (1,)],
    "4MB": [(256, 512)] * 8,
    "64MB": [(2048, 1024)] * 8,
    "256MB": [(2048, 1024)] * 32,
}


def _rss_mb() -> float:
    """This process's resident memory now (VmRSS)."""
    return status_mb("self", "VmRSS")


def _median_us(run, iterations: int) -> float:
    return statistics.median(durations(run, iterations)) * 1e6


def measure(shapes, iterations: int, blocks: int) -> dict[str, float]:
    variables = [tf.Variable(tf.random.normal(shape)) for shape in shapes]
    snapshot = VariableSnapshot(variables)
    handles = [v.handle for v in variables]
    attrs = ("N", len(variables), "dtypes", [v.dtype.as_datatype_enum for v in variables])
    ctx = context.context()

    @tf.function
    def update():
        for v in variables:
            v.assign_sub(0.001 * v)

    def eager_read():
        execute.execute("_ReadVariablesOp", len(variables), handles, attrs, ctx)

    def take_then_update():
        snapshot.take()
        update()

    update()
    before = _rss_mb()
    snapshot.take()
    update()
    held_mb = _rss_mb() - before
    eager_read()
    results: dict[str, list[float]] = {"take_us": [], "eager_read_us": [], "update_us": [],
                                       "take_then_update_us": []}
    for block in range(blocks):
        runs = [("take_us", snapshot.take), ("eager_read_us", eager_read),
                ("update_us", update), ("take_then_update_us", take_then_update)]
        for name, run in (runs if block % 2 == 0 else runs[::-1]):
            results[name].append(_median_us(run, iterations))
    summary = {name: round(statistics.median(values), 2) for name, values in results.items()}
    summary["copy_on_write_us"] = round(summary["take_then_update_us"] - summary["update_us"]
                                        - summary["take_us"], 2)
    summary["megabytes"] = round(sum(v.numpy().nbytes for v in variables) / 2**20, 3)
    summary["held_mb"] = round(held_mb, 1)
    return summary


def compare(rounds: int, iterations: int, blocks: int) -> dict:
    """Copy-on-write with one-pass and two-pass updates, in alternating child processes."""
    runs: dict[str, list[dict]] = {"one_pass": [], "two_pass": []}
    for round_index in range(rounds):
        order = [("one_pass", "1"), ("two_pass", "0")]
        for kind, setting in (order if round_index % 2 == 0 else order[::-1]):
            print(f"round {round_index + 1}/{rounds}: {kind.replace('_', '-')} updates",
                  flush=True)
            out = subprocess.run(
                [sys.executable, __file__, "--iterations", str(iterations), "--blocks",
                 str(blocks)], capture_output=True, text=True, check=True, timeout=1800,
                env=dict(os.environ, TFE_ONE_PASS_UPDATES=setting, TF_CPP_MIN_LOG_LEVEL="3"))
            runs[kind].append(json.loads(out.stdout.strip().splitlines()[-1]))
    summary = {}
    print(f"{'model':<10}{'MB':>8}{'one-pass cow us':>17}{'two-pass cow us':>17}"
          f"{'update us':>12}")
    for name in SIZES:
        row = {kind: round(statistics.median(r[name]["copy_on_write_us"] for r in results), 1)
               for kind, results in runs.items()}
        row["update_us"] = round(statistics.median(
            r[name]["update_us"] for results in runs.values() for r in results), 1)
        row["megabytes"] = runs["one_pass"][0][name]["megabytes"]
        summary[name] = row
        print(f"{name:<10}{row['megabytes']:>8.2f}{row['one_pass']:>17.1f}{row['two_pass']:>17.1f}"
              f"{row['update_us']:>12.1f}", flush=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=200, help="calls per block (default 200)")
    parser.add_argument("--blocks", type=int, default=6,
                        help="alternating blocks per measurement (default 6)")
    parser.add_argument("--rounds", type=int, default=0,
                        help="compare one-pass and two-pass updates over this many rounds of "
                        "child processes (default 0: one measurement in this process)")
    args = parser.parse_args(argv)
    if args.rounds > 0:
        print(json.dumps(compare(args.rounds, args.iterations, args.blocks)))
        return 0
    summary = {}
    print(f"{'model':<10}{'MB':>8}{'take us':>10}{'eager read us':>15}{'update us':>12}"
          f"{'take+update us':>16}{'copy-on-write us':>18}{'held MB':>9}")
    for name, shapes in SIZES.items():
        r = measure(shapes, args.iterations, args.blocks)
        summary[name] = r
        print(f"{name:<10}{r['megabytes']:>8.2f}{r['take_us']:>10.1f}{r['eager_read_us']:>15.1f}"
              f"{r['update_us']:>12.1f}{r['take_then_update_us']:>16.1f}"
              f"{r['copy_on_write_us']:>18.1f}{r['held_mb']:>9.1f}", flush=True)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
