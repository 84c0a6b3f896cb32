"""Index-addressable sources: inputs a newcomer can enter at any global batch in O(1).

tf.data sources that support random access (range, from_tensor_slices, and
map/batch/... over them) let the elastic dataset read exactly this worker's
elements at the cursor. A file list whose record counts are known is made one
here by addressing records by their global index.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf


def indexed_records(files: Sequence[str], sizes: Sequence[int],
                    read_record: Callable[[tf.Tensor, tf.Tensor], Any]) -> tf.data.Dataset:
    """All records of `files` in order, element i read by `read_record(file, index_in_file)`.

    `sizes[k]` is the number of records of `files[k]`. The result is a map over
    a range, so it supports random access: the elastic dataset fetches only
    this worker's records at the cursor, whatever the cursor is, provided
    `read_record` itself reads one record without scanning its file.
    """
    if len(files) != len(sizes):
        raise ValueError(f"files and sizes differ in length ({len(files)} != {len(sizes)})")
    if not files:
        raise ValueError("files is empty")
    sizes_array = np.asarray(sizes, dtype=np.int64)
    if (sizes_array < 0).any():
        raise ValueError(f"sizes must be non-negative, got {list(sizes)}")
    ends = tf.constant(np.cumsum(sizes_array))
    starts = ends - tf.constant(sizes_array)
    names = tf.constant(list(files), dtype=tf.string)

    def read(index: tf.Tensor) -> Any:
        # The file is the first one whose end lies beyond the index.
        file_index = tf.searchsorted(ends, tf.reshape(index, [1]), side="right")[0]
        return read_record(names[file_index], index - starts[file_index])

    return tf.data.Dataset.range(int(sizes_array.sum())).map(read)
