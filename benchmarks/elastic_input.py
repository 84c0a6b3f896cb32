"""Benchmark of the elastic input (issue 6).

Measures, on one process:
  throughput_ratio  elements/s of the elastic pipeline / stock shard + batch on
                    the same source and the same per-worker batches, over full
                    passes that alternate; the lower of a plain and a mapped
                    source's medians (goal >= 0.95)
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
import gc
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
WORLD_SIZE = 2
INDEX_SOURCE_SIZE = 10_000_000


def state(value: int) -> tf.Variable:
    with tf.device("/cpu:0"):
        return tf.Variable(value, dtype=tf.int64, trainable=False)


def plain_source(num_elements: int) -> tf.data.Dataset:
    """Bare ids: the per-element overhead of the two pipelines and nothing else."""
    return tf.data.Dataset.range(num_elements)


def features(i: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    return i, tf.fill([FEATURES], tf.cast(i, tf.float32))


def source(num_elements: int) -> tf.data.Dataset:
    """Ids with a small feature vector, as a training input would carry."""
    return tf.data.Dataset.range(num_elements).map(features)


def slice_start(cursor: int, global_batch: int, world_size: int, rank: int) -> int:
    """Where the GlobalBatchSlice rule puts a rank's slice, to check the batches."""
    base, extra = divmod(global_batch, world_size)
    return cursor * global_batch + rank * base + min(rank, extra)


@tf.function
def drain(iterator) -> tuple[tf.Tensor, tf.Tensor]:
    """Reads the iterator to its end in C++: the number of elements and of batches."""
    elements, batches = tf.constant(0, tf.int64), tf.constant(0, tf.int64)
    for batch in iterator:
        elements += tf.shape(tf.nest.flatten(batch)[0], tf.int64)[0]
        batches += 1
    return elements, batches


def timed_pass(dataset: tf.data.Dataset) -> tuple[float, tuple[int, int]]:
    """Elements/s of one full pass over a fresh iterator, and how much it read."""
    start = time.perf_counter()
    iterator = iter(dataset)
    elements, batches = drain(iterator)
    elements = int(elements)
    rate = elements / (time.perf_counter() - start)
    del iterator  # stops its threads before the next pipeline runs
    gc.collect()
    return rate, (elements, int(batches))


def throughput(pipelines: dict, runs: int) -> dict[str, list[float]]:
    """Elements/s of each pipeline over `runs` full passes.

    The pipelines take turns, one at a time (a live iterator's prefetch
    threads would steal the CPU from the one being timed), in an order that
    alternates between runs, so a change of machine load skews all alike. A
    first untimed pass of each traces `drain`. Every pass must yield the same
    number of elements in the same number of batches (which ids differs only
    by the split rule: stock shard takes every other element, the elastic op
    a contiguous half of each global batch).
    """
    expected = {timed_pass(make())[1] for make in pipelines.values()}
    assert len(expected) == 1, f"the pipelines read different amounts: {expected}"
    rates = {name: [] for name in pipelines}
    for run in range(runs):
        for name in (list(pipelines) if run % 2 == 0 else list(pipelines)[::-1]):
            rate, read = timed_pass(pipelines[name]())
            assert {read} == expected, f"{name} read {read}, expected {expected}"
            rates[name].append(rate)
    return rates


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
    parser.add_argument("--plain-elements", type=int, default=2_000_000,
                        help="size of the plain source for the throughput comparison")
    parser.add_argument("--mapped-elements", type=int, default=200_000,
                        help="size of the mapped source for the throughput comparison")
    parser.add_argument("--global-batch", type=int, default=256)
    args = parser.parse_args()

    # Stock is shard + batch on the same source, with tf.data's defaults
    # (an autotuned prefetch after the batch). The headline ratio is the lower
    # of the two sources' medians.
    # Whole global batches of an even size: stock's shard then yields the same ids.
    if args.global_batch % WORLD_SIZE:
        parser.error(f"--global-batch must be a multiple of {WORLD_SIZE}")
    per_worker = args.global_batch // WORLD_SIZE
    sources = {name: (make_source, elements - elements % args.global_batch)
               for name, make_source, elements in (("plain", plain_source, args.plain_elements),
                                                    ("mapped", source, args.mapped_elements))}
    medians = {}
    for name, (make_source, elements) in sources.items():
        pipelines = {
            "stock": lambda make=make_source, n=elements: make(n).shard(
                WORLD_SIZE, 0).batch(per_worker),
            "elastic": lambda make=make_source, n=elements: elastic_dataset(
                make(n), args.global_batch, state(WORLD_SIZE), state(0)),
        }
        if name == "mapped":
            # For reference: stock sharding before the map, so that it maps
            # only this worker's elements, as the elastic op does.
            pipelines["stock_shard_first"] = lambda n=elements: tf.data.Dataset.range(n).shard(
                WORLD_SIZE, 0).map(features).batch(per_worker)
        rates = throughput(pipelines, args.runs)
        ratios = [e / s for e, s in zip(rates["elastic"], rates["stock"])]
        medians[name] = statistics.median(ratios)
        for pipeline, values in rates.items():
            print(f"{name} source, {pipeline}: median {statistics.median(values):,.0f} elements/s "
                  f"(range {min(values):,.0f} to {max(values):,.0f}, {len(values)} passes of "
                  f"{elements // WORLD_SIZE:,} elements)", flush=True)
        print(f"{name} source: elastic / stock median {medians[name]:.3f} (runs: "
              f"{', '.join(f'{r:.3f}' for r in ratios)})", flush=True)
        if "stock_shard_first" in rates:
            reference = statistics.median(
                e / s for e, s in zip(rates["elastic"], rates["stock_shard_first"]))
            print(f"{name} source: elastic / stock sharding before the map, median "
                  f"{reference:.3f} (reference, not the headline)", flush=True)
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
