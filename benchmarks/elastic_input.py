"""Benchmark of the elastic input.

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

With --tfrecord it measures instead the TFRecord case (realistic
`tf.train.Example`s, --tfrecord-mb MB in 16 files written once to --tfrecord-dir):
  tfrecord_ratio        one worker: elements/s of `TFRecordDataset(files).map(parse)
                        .shuffle(B).batch(G)` through the elastic input / stock
                        `TFRecordDataset(files, num_parallel_reads=AUTOTUNE).map(parse,
                        AUTOTUNE).shuffle(B).batch(G).prefetch(AUTOTUNE)` (goal >= 0.95)
  bytes_read_share      3 workers: the bytes each reads in a pass (the process's rchar)
                        over the files' bytes (goal about 1/3 each)
  newcomer_ms           a newcomer (world 3, rank 2) entering epoch 1 at the middle of
                        the pass: seek, iterator, first batch (goal <= 50 ms); also
                        with building its pipeline (newcomer_with_build_ms)
  index_s_per_gb        index build, in a fresh process: cold (no cache) and warm
                        (from the cache directory), and warm in memory

    .venv/bin/python benchmarks/elastic_input.py [--runs 5] [--tfrecord]
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
from tensorflow_elastic.data.batched import distribute_batched  # noqa: E402
from tensorflow_elastic.data.tfrecord import TFRecordIndex  # noqa: E402

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


TFRECORD_FILES = 16
TFRECORD_SHUFFLE_BUFFER = 10_000
EXAMPLE_FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/height": tf.io.FixedLenFeature([], tf.int64),
    "image/width": tf.io.FixedLenFeature([], tf.int64),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    "image/object/bbox": tf.io.FixedLenFeature([16], tf.float32),
    "embedding": tf.io.FixedLenFeature([64], tf.float32),
    "text": tf.io.FixedLenFeature([], tf.string),
}


def realistic_example(i: int, rng) -> bytes:
    """An image-classification record: encoded bytes (incompressible), sizes, a label, boxes,
    an embedding and a caption."""
    def ints(*v):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=v))

    def floats(v):
        return tf.train.Feature(float_list=tf.train.FloatList(value=v))

    def raw(v):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))

    feature = {"image/encoded": raw(rng.bytes(int(rng.integers(1800, 2800)))),
               "image/height": ints(int(rng.integers(200, 400))),
               "image/width": ints(int(rng.integers(200, 400))),
               "image/class/label": ints(i % 1000),
               "image/object/bbox": floats(rng.random(16).tolist()),
               "embedding": floats(rng.standard_normal(64).tolist()),
               "text": raw(f"example {i}: a caption of a few words".encode())}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_tfrecord_files(directory: str, megabytes: int) -> list[str]:
    """16 files of about `megabytes` MB in all, written once (kept for later runs)."""
    import numpy as np

    files = [os.path.join(directory, f"part-{k:02d}.tfrecord") for k in range(TFRECORD_FILES)]
    done = os.path.join(directory, f"complete-{megabytes}mb")
    if os.path.exists(done):
        return files
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(0)
    per_file = megabytes * 1_000_000 // TFRECORD_FILES
    i = 0
    for path in files:
        with tf.io.TFRecordWriter(path) as writer:
            written = 0
            while written < per_file:
                record = realistic_example(i, rng)
                writer.write(record)
                written += len(record) + 16
                i += 1
    open(done, "w").close()
    return files


def parse(record):
    return tf.io.parse_single_example(record, EXAMPLE_FEATURES)


def read_bytes() -> int:
    """Bytes this process has read through read/pread calls so far (Linux)."""
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("rchar"))


def user_pipeline(files: list[str], global_batch: int) -> tf.data.Dataset:
    """What a user writes and hands to Keras (the elastic input takes it as it is)."""
    return tf.data.TFRecordDataset(files).map(parse, num_parallel_calls=tf.data.AUTOTUNE).shuffle(
        TFRECORD_SHUFFLE_BUFFER, seed=1).batch(global_batch)


def elastic_tfrecord(files: list[str], global_batch: int, world_size: int, rank: int,
                     cursor: int = 0, epoch: int = 0) -> tf.data.Dataset:
    dataset = distribute_batched(user_pipeline(files, global_batch), state(world_size),
                                 state(rank))
    dataset.seek(cursor, epoch)
    return dataset


_INDEX_PROBE = """
import sys, time
sys.path.insert(0, {root!r})
import tensorflow as tf
from tensorflow_elastic.data.tfrecord import TFRecordIndex
files = {files!r}
TFRecordIndex(files[:1], cache_dir="/nonexistent-so-not-cached")  # loads the op library
start = time.perf_counter()
TFRecordIndex(files, cache_dir={cache_dir!r})
print(time.perf_counter() - start)
"""


def index_seconds(files: list[str], cache_dir: str) -> float:
    """The index build of `files` in a fresh process (nothing kept in memory)."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", _INDEX_PROBE.format(
        root=root, files=files, cache_dir=cache_dir)], capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def tfrecord_case(args) -> dict:
    import shutil
    import tempfile

    files = write_tfrecord_files(args.tfrecord_dir, args.tfrecord_mb)
    total_bytes = sum(os.path.getsize(f) for f in files)
    gigabytes = total_bytes / 1e9
    print(f"{len(files)} files, {total_bytes / 1e6:,.0f} MB in {args.tfrecord_dir}", flush=True)

    cold, warm = [], []
    for _ in range(args.runs):
        cache_dir = tempfile.mkdtemp(prefix="tfe-index-")
        cold.append(index_seconds(files, cache_dir) / gigabytes)
        warm.append(index_seconds(files, cache_dir) / gigabytes)
        shutil.rmtree(cache_dir)
    index = TFRecordIndex(files, cache_dir="")
    start = time.perf_counter()
    TFRecordIndex(files, cache_dir="")
    memory = (time.perf_counter() - start) / gigabytes
    print(f"index build: {index.size:,} records; cold (fresh process, no cache, files in the OS "
          f"page cache) median {statistics.median(cold):.3f} s/GB, warm from the cache directory "
          f"{statistics.median(warm):.4f} s/GB, kept in memory {memory:.5f} s/GB", flush=True)

    global_batch = args.global_batch
    pipelines = {
        "stock": lambda: tf.data.TFRecordDataset(
            files, num_parallel_reads=tf.data.AUTOTUNE).map(
            parse, num_parallel_calls=tf.data.AUTOTUNE).shuffle(TFRECORD_SHUFFLE_BUFFER).batch(
            global_batch).prefetch(tf.data.AUTOTUNE),
        "elastic": lambda: elastic_tfrecord(files, global_batch, 1, 0),
    }
    rates = throughput(pipelines, args.runs)
    ratios = [e / s for e, s in zip(rates["elastic"], rates["stock"])]
    for name, values in rates.items():
        print(f"tfrecord, one worker, {name}: median {statistics.median(values):,.0f} elements/s "
              f"(range {min(values):,.0f} to {max(values):,.0f}, {len(values)} passes of "
              f"{index.size:,} records)", flush=True)
    print(f"tfrecord: elastic / stock median {statistics.median(ratios):.3f} (runs: "
          f"{', '.join(f'{r:.3f}' for r in ratios)})", flush=True)

    shares = []
    for rank in range(3):
        dataset = elastic_tfrecord(files, global_batch, 3, rank)
        before = read_bytes()
        timed_pass(dataset)
        shares.append((read_bytes() - before) / total_bytes)
    before = read_bytes()
    timed_pass(pipelines["stock"]())
    stock_share = (read_bytes() - before) / total_bytes
    print(f"3 workers: bytes read in a pass over the files' {total_bytes / 1e6:,.0f} MB: "
          f"{', '.join(f'rank {r} {s:.3f}' for r, s in enumerate(shares))} (stock, one "
          f"worker: {stock_share:.3f})", flush=True)

    # A newcomer's entry: its pipeline is built (as the existing members' was, and as the
    # range benchmark above builds its input first); it seeks the committed cursor of epoch 1
    # and takes its first batch. For reference, also everything from the user's dataset on.
    middle = index.size // global_batch // 2
    newcomer, from_scratch = [], []
    for _ in range(args.runs):
        start = time.perf_counter()
        dataset = elastic_tfrecord(files, global_batch, 3, 2)
        built = time.perf_counter()
        dataset.seek(middle, epoch=1)
        batch = next(iter(dataset))
        done = time.perf_counter()
        newcomer.append((done - built) * 1e3)
        from_scratch.append((done - start) * 1e3)
        assert int(tf.shape(batch["embedding"])[0]) == global_batch // 3 + (2 < global_batch % 3)
    print(f"newcomer (world 3, rank 2) at global batch {middle} of epoch 1: seek, iterator and "
          f"first batch median {statistics.median(newcomer):.1f} ms (runs: "
          f"{', '.join(f'{t:.1f}' for t in newcomer)}); with building the pipeline from the "
          f"user's dataset (index kept in memory) median {statistics.median(from_scratch):.1f} "
          f"ms", flush=True)
    return {"tfrecord_ratio": round(statistics.median(ratios), 4),
            "bytes_read_share": [round(s, 4) for s in shares],
            "newcomer_ms": round(statistics.median(newcomer), 2),
            "newcomer_with_build_ms": round(statistics.median(from_scratch), 2),
            "index_s_per_gb": {"cold": round(statistics.median(cold), 4),
                               "warm_cache_dir": round(statistics.median(warm), 5),
                               "warm_memory": round(memory, 6)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--plain-elements", type=int, default=2_000_000,
                        help="size of the plain source for the throughput comparison")
    parser.add_argument("--mapped-elements", type=int, default=200_000,
                        help="size of the mapped source for the throughput comparison")
    parser.add_argument("--global-batch", type=int, default=256)
    parser.add_argument("--tfrecord", action="store_true",
                        help="measure the TFRecord case instead (files written once)")
    parser.add_argument("--tfrecord-dir", default="/tmp/tfe-bench-tfrecord")
    parser.add_argument("--tfrecord-mb", type=int, default=208)
    args = parser.parse_args()
    if args.tfrecord:
        print(json.dumps(tfrecord_case(args)))
        return

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
