"""Benchmark of the elastic input (issue 6).

Measures, on one process:
  throughput_ratio  elements/s of the elastic pipeline / stock shard + batch on
                    the same source and the same per-worker batches (goal >= 0.95)
  reshard_ms        from a membership change (assigning the world-size and rank
                    variables) to the first correctly resharded batch, with no
                    pipeline rebuild (goal < 10 ms)
  fast_forward_ms   a newcomer's start at the cursor of a 10-million-element
                    index-addressable source: build, iterator, first batch (goal < 50 ms)
It also prints, for the record, the fast-forward of a streaming source, which
is O(cursor). Progress goes to stdout; the last line is the JSON summary of
medians over --runs repetitions.

    .venv/bin/python benchmarks/elastic_input.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

from tensorflow_elastic.data import elastic_dataset  # noqa: E402

FEATURES = 32
INDEX_SOURCE_SIZE = 10_000_000


def state(value: int) -> tf.Variable:
    with tf.device("/cpu:0"):
        return tf.Variable(value, dtype=tf.int64, trainable=False)


def plain_source(num_elements: int) -> tf.data.Dataset:
    """Bare ids: the per-element overhead of the two pipelines and nothing else."""
    return tf.data.Dataset.range(num_elements)


def source(num_elements: int) -> tf.data.Dataset:
    """Ids with a small feature vector, as a training input would carry."""
    return tf.data.Dataset.range(num_elements).map(
        lambda i: (i, tf.fill([FEATURES], tf.cast(i, tf.float32))))


def slice_start(cursor: int, global_batch: int, world_size: int, rank: int) -> int:
    """Where the GlobalBatchSlice rule puts a rank's slice, to check the batches."""
    base, extra = divmod(global_batch, world_size)
    return cursor * global_batch + rank * base + min(rank, extra)


@tf.function
def pull(iterator, batches: tf.Tensor) -> tf.Tensor:
    """Takes `batches` batches in C++ and counts their elements, so Python does not dominate."""
    total = tf.constant(0, tf.int64)
    for _ in tf.range(batches):
        total += tf.shape(tf.nest.flatten(next(iterator))[0], tf.int64)[0]
    return total


def throughput_ratio(make_source, num_elements: int, global_batch: int,
                     world_size: int) -> tuple[float, float]:
    """Elastic vs stock elements/s: the median ratio over back-to-back slices.

    Each slice pair runs under the same machine load, and the order alternates,
    so a busy machine skews both sides alike.
    """
    per_worker = global_batch // world_size
    pipelines = {
        "stock": iter(make_source(num_elements).shard(world_size, 0).batch(per_worker)),
        "elastic": iter(elastic_dataset(make_source(num_elements), global_batch,
                                        state(world_size), state(0))),
    }
    chunk = tf.constant(10, tf.int64)
    ratios, elastic_rates = [], []
    for slice_index in range(num_elements // global_batch // 10):
        rates = {}
        order = sorted(pipelines, reverse=slice_index % 2 == 1)
        for name in order:
            start = time.perf_counter()
            count = int(pull(pipelines[name], chunk))
            rates[name] = count / (time.perf_counter() - start)
        ratios.append(rates["elastic"] / rates["stock"])
        elastic_rates.append(rates["elastic"])
    return statistics.median(ratios), statistics.median(elastic_rates)


def reshard_ms(make_source, global_batch: int, changes: int) -> tuple[list[float], list[float]]:
    """Times of the first batch after each membership change, and of a batch without one."""
    world_size, rank = state(2), state(0)
    dataset = elastic_dataset(make_source(INDEX_SOURCE_SIZE), global_batch, world_size, rank)
    iterator = iter(dataset)
    next(iterator)
    resharded, steady = [], []
    for change in range(changes):
        start = time.perf_counter()
        next(iterator)
        steady.append((time.perf_counter() - start) * 1e3)
        new_world, new_rank = (3, 1) if change % 2 == 0 else (2, 0)
        cursor = int(dataset.cursor)
        start = time.perf_counter()
        world_size.assign(new_world)
        rank.assign(new_rank)
        ids = tf.nest.flatten(next(iterator))[0]
        resharded.append((time.perf_counter() - start) * 1e3)
        expected_size = global_batch // new_world + (new_rank < global_batch % new_world)
        assert int(ids[0]) == slice_start(cursor, global_batch, new_world, new_rank), "wrong reshard"
        assert len(ids) == expected_size, "wrong reshard"
    return resharded, steady


def fast_forward_ms(input_dataset: tf.data.Dataset, global_batch: int, cursor: int) -> float:
    """A newcomer: new variables holding the cursor, the elastic pipeline, its first batch.

    The input is built beforehand: tracing its map function costs the same at
    any cursor and is not part of the fast-forward.
    """
    start = time.perf_counter()
    dataset = elastic_dataset(input_dataset, global_batch, state(3), state(2), state(cursor))
    ids = tf.nest.flatten(next(iter(dataset)))[0]
    elapsed = (time.perf_counter() - start) * 1e3
    assert int(ids[0]) == slice_start(cursor, global_batch, 3, 2), "wrong fast-forward"
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--elements", type=int, default=200_000,
                        help="source size for the throughput comparison")
    parser.add_argument("--global-batch", type=int, default=256)
    args = parser.parse_args()

    # The headline ratio is the lower of the two sources' medians: with a
    # mapped source stock shard also maps the other workers' elements.
    ratios = {"plain": [], "mapped": []}
    for run in range(args.runs):
        for name, make_source in (("plain", plain_source), ("mapped", source)):
            ratio, rate = throughput_ratio(make_source, args.elements, args.global_batch,
                                           world_size=2)
            ratios[name].append(ratio)
            print(f"throughput run {run + 1}/{args.runs}, {name} source: elastic {rate:,.0f} "
                  f"elements/s, ratio to shard+batch {ratio:.3f}", flush=True)
    medians = {name: statistics.median(values) for name, values in ratios.items()}
    print(f"throughput ratio medians: {medians}", flush=True)

    # The headline is the mapped source: its first resharded batch has to be
    # computed on the spot, where a steady batch was prepared ahead.
    reshard_medians = {}
    for name, make_source in (("plain", plain_source), ("mapped", source)):
        reshards, steady = reshard_ms(make_source, args.global_batch, changes=10 * args.runs)
        reshard_medians[name] = statistics.median(reshards)
        print(f"reshard, {name} source: {len(reshards)} membership changes, median "
              f"{statistics.median(reshards):.3f} ms, max {max(reshards):.3f} ms (a batch "
              f"without a change: median {statistics.median(steady):.3f} ms)", flush=True)

    cursor = (INDEX_SOURCE_SIZE - args.global_batch) // args.global_batch
    fast_forwards = []
    for run in range(args.runs):
        fast_forwards.append(fast_forward_ms(source(INDEX_SOURCE_SIZE), args.global_batch,
                                             cursor))
        print(f"fast-forward run {run + 1}/{args.runs}: newcomer at global batch {cursor} of a "
              f"{INDEX_SOURCE_SIZE:,}-element index source in {fast_forwards[-1]:.2f} ms",
              flush=True)

    stream_cursor = 100_000 // args.global_batch
    stream_ms = fast_forward_ms(source(INDEX_SOURCE_SIZE).filter(lambda i, x: i >= 0),
                                args.global_batch, stream_cursor)
    print(f"streaming source (no random access): fast-forward over "
          f"{stream_cursor * args.global_batch:,} elements took {stream_ms:.0f} ms "
          f"(O(cursor); for reference, not a goal)", flush=True)

    print(json.dumps({"throughput_ratio": round(min(medians.values()), 4),
                      "reshard_ms": round(reshard_medians["mapped"], 3),
                      "fast_forward_ms": round(statistics.median(fast_forwards), 3)}))


if __name__ == "__main__":
    main()
