"""Pipelines over TFRecord files, taken as users write them, rebuilt to read records by index.

`TFRecordDataset(files)` (or a deterministic `interleave`/`flat_map` of
`TFRecordDataset` over a constant list of files), then per-example `map`s: the
elastic input rebuilds this as the same records in the same order, read by
record index (data/tfrecord.py) and mapped by the same functions, so each
worker reads and parses only its own records and a newcomer enters at any
cursor. Anything else stays as it is (a stream, or an index-addressable source
already). Compressed files are read as a stream when the result is still
exact (no shuffle), and refused, saying what to change, when they are not.
"""

from __future__ import annotations

import copy
import dataclasses
import logging

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.python.data.ops import (dataset_ops, flat_map_op, from_tensor_slices_op,
                                        interleave_op, map_op, prefetch_op, readers)
from tensorflow.python.framework import tensor_util
from tensorflow.python.ops import gen_dataset_ops

from tensorflow_elastic.data.tfrecord import TFRecordIndex

_log = logging.getLogger(__name__)
_logged: set[str] = set()

_PER_EXAMPLE_MAPS = (map_op._MapDataset, map_op._ParallelMapDataset)
# Buffers and options between the reader and the maps: the elastic input does its own lookahead.
_PASS_THROUGH = (prefetch_op._PrefetchDataset, dataset_ops._OptionsDataset)
_FILE_READERS = (interleave_op._InterleaveDataset, interleave_op._ParallelInterleaveDataset,
                 flat_map_op._FlatMapDataset, readers.ParallelInterleaveDataset)
# What a function that only opens a TFRecordDataset on its argument holds.
_READER_FUNCTION_OPS = frozenset({"Placeholder", "Const", "Reshape", "Identity", "NoOp",
                                  "TensorSliceDataset", "FlatMapDataset", "TFRecordDataset",
                                  "TFRecordDatasetV2"})
_COMPRESSIONS = ("GZIP", "ZLIB")


@dataclasses.dataclass(frozen=True)
class TFRecordReading:
    """How a pipeline reads its TFRecord files: which, and in what interleaved order."""

    files: tuple[str, ...]
    cycle_length: int = 1
    block_length: int = 1
    compression: str = ""


def _log_once(message: str) -> None:
    if message not in _logged:
        _logged.add(message)
        _log.warning(message)


def _constant(tensor, what: str):
    value = tensor_util.constant_value(tensor) if tensor is not None else None
    if value is None:
        raise ValueError(f"the {what} of the input's TFRecord reader must be a constant")
    return value


def _constant_files(filenames: tf.data.Dataset) -> tuple[str, ...] | None:
    """The file names of a `from_tensor_slices` over a constant list, else None."""
    if not isinstance(filenames, from_tensor_slices_op._TensorSliceDataset):
        return None
    if len(filenames._tensors) != 1 or filenames._tensors[0].dtype != tf.string:
        return None
    value = tensor_util.constant_value(filenames._tensors[0])
    if value is None:
        return None
    return tuple(v.decode() if isinstance(v, bytes) else str(v) for v in np.reshape(value, -1))


def _positive_or_one(tensor, what: str) -> int:
    """An interleave's cycle or block length; AUTOTUNE (or none) is read as 1: file after file.

    Stock tf.data makes an autotuned cycle as long as the machine's cores, so its order
    would differ between machines; the order every member shares is the files' own.
    """
    value = int(_constant(tensor, what))
    return value if value > 0 else 1


def _function_reads_tfrecords(node) -> str | None:
    """The compression ("" for none) if the node's function only opens a TFRecordDataset on its
    argument, else None."""
    graph_def = node._map_func.function.graph.as_graph_def()
    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    ops = {n.op for n in nodes}
    if not ops <= _READER_FUNCTION_OPS or not ops & {"TFRecordDataset", "TFRecordDatasetV2"}:
        return None
    for n in nodes:
        if n.op == "Const" and n.attr["value"].tensor.string_val:
            value = n.attr["value"].tensor.string_val[0].decode(errors="replace").upper()
            if value in _COMPRESSIONS:
                return value
    return ""


def _deterministic(node) -> bool:
    """Whether a parallel interleave produces its elements in a fixed order."""
    if isinstance(node, readers.ParallelInterleaveDataset):
        return node._deterministic != "false"
    if not isinstance(node, interleave_op._ParallelInterleaveDataset):
        return True
    graph = graph_pb2.GraphDef.FromString(node._as_serialized_graph().numpy())
    flag = next((n.attr["deterministic"].s.decode() for n in graph.node
                 if n.op.startswith("ParallelInterleaveDataset")), "default")
    if flag == "default":
        return node.options().deterministic is not False
    return flag == "true"


def tfrecord_reading(node: tf.data.Dataset) -> TFRecordReading | None:
    """How `node` reads TFRecord files, if it is a reader of a constant list of them.

    Raises ValueError, saying what to change, for a non-deterministic interleave of them.
    """
    if isinstance(node, readers.TFRecordDatasetV2):
        files = _constant_files(node._filenames)
        if files is None:
            return None
        compression = node._compression_type
        compression = "" if compression is None else _constant(compression, "compression_type")
        compression = compression.decode() if isinstance(compression, bytes) else str(compression)
        reads = node._num_parallel_reads
        cycle = 1 if reads is None else _positive_or_one(reads, "num_parallel_reads")
        return TFRecordReading(files, cycle, 1, compression.upper())
    if not isinstance(node, _FILE_READERS):
        return None
    files = _constant_files(node._input_dataset)
    compression = _function_reads_tfrecords(node) if files is not None else None
    if compression is None:
        return None
    if not _deterministic(node):
        raise ValueError(
            "the input interleaves its TFRecord files non-deterministically: the workers would "
            "read the records in different orders; pass deterministic=True to interleave (and "
            "do not set options.deterministic = False)")
    if isinstance(node, flat_map_op._FlatMapDataset):
        return TFRecordReading(files, compression=compression)
    return TFRecordReading(files, _positive_or_one(node._cycle_length, "cycle_length"),
                           _positive_or_one(node._block_length, "block_length"), compression)


def interleave_order(counts: np.ndarray, cycle_length: int, block_length: int) -> np.ndarray:
    """The positions, in the files' concatenation, of the records tf.data's `interleave`
    produces in turn over files of `counts` records (an exhausted file's place in the cycle is
    taken by the next file when the cycle comes back to it)."""
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    if cycle_length <= 1 or len(counts) <= 1:
        return np.arange(int(np.sum(counts)), dtype=np.int64)
    # tf.data's InterleaveDataset step by step, one block (or its rest) at a time.
    slots: list[list[int] | None] = [None] * cycle_length  # [file, records taken]
    order: list[np.ndarray] = []
    place = block_index = next_file = open_files = 0
    end_of_files = False
    while not end_of_files or open_files:
        slot = slots[place]
        if slot is not None and slot[1] < counts[slot[0]]:
            file, taken = slot
            take = min(block_length - block_index, int(counts[file]) - taken)
            order.append(starts[file] + taken + np.arange(take, dtype=np.int64))
            slot[1] += take
            block_index += take
            if block_index == block_length:
                block_index, place = 0, (place + 1) % cycle_length
        elif slot is not None:  # the file is exhausted: its place moves on
            slots[place] = None
            open_files -= 1
            block_index, place = 0, (place + 1) % cycle_length
        elif next_file < len(counts):
            slots[place] = [next_file, 0]
            next_file += 1
            open_files += 1
        elif not end_of_files:
            end_of_files = True
        else:
            block_index, place = 0, (place + 1) % cycle_length
    return np.concatenate(order) if order else np.zeros(0, np.int64)


def addressable(examples: tf.data.Dataset, shuffled: bool) -> tf.data.Dataset:
    """`examples` read by record index if it reads TFRecord files, else `examples` itself.

    `shuffled`: whether a shuffle follows (a compressed input, which can only be a stream,
    is then refused: a stream cannot be shuffled the same on every worker).
    """
    maps = []
    node = examples
    while isinstance(node, _PASS_THROUGH + _PER_EXAMPLE_MAPS):
        if isinstance(node, _PER_EXAMPLE_MAPS):
            maps.append(node)
        node = node._input_dataset
    reading = tfrecord_reading(node)
    if reading is None:
        return examples
    if reading.compression:
        if shuffled:
            raise ValueError(
                f"the input's TFRecord files are {reading.compression}-compressed: records in "
                f"compressed files cannot be addressed, so the shuffle cannot be made the same "
                f"on every worker; decompress the files (compression_type=None), or drop the "
                f".shuffle (then every worker reads the whole stream)")
        _log_once(f"the input's TFRecord files are {reading.compression}-compressed: every "
                  f"worker reads all of them as a stream and keeps its share (decompress them "
                  f"to read only each worker's records)")
        return examples
    index = TFRecordIndex(reading.files)
    index.check_same_features()
    records = index.records(interleave_order(index.counts, reading.cycle_length,
                                             reading.block_length)
                            if reading.cycle_length > 1 else None)
    for node in reversed(maps):
        records = _map_again(node, records)
    return records


def _map_again(node, records: tf.data.Dataset) -> tf.data.Dataset:
    """The user's `map` node applied to `records`: the same traced function and settings (a
    parallel map made deterministic), not traced again."""
    mapped = copy.copy(node)
    mapped._input_dataset = records
    function = node._map_func.function
    if isinstance(node, map_op._ParallelMapDataset):
        mapped._deterministic = "true"
        variant = gen_dataset_ops.parallel_map_dataset_v2(
            records._variant_tensor, function.captured_inputs, f=function,
            num_parallel_calls=node._num_parallel_calls, deterministic="true",
            use_inter_op_parallelism=node._use_inter_op_parallelism,
            preserve_cardinality=node._preserve_cardinality,
            use_unbounded_threadpool=node._use_unbounded_threadpool, **node._common_args)
    else:
        variant = gen_dataset_ops.map_dataset(
            records._variant_tensor, function.captured_inputs, f=function,
            use_inter_op_parallelism=node._use_inter_op_parallelism,
            preserve_cardinality=node._preserve_cardinality,
            force_synchronous=node._force_synchronous, **node._common_args)
    dataset_ops.UnaryDataset.__init__(mapped, records, variant)
    return mapped
