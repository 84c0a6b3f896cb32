"""The op library: loading, its clear errors, and the GlobalBatchSlice op."""

import os

import pytest
import tensorflow as tf

from tensorflow_elastic import ops


def test_library_loads_once_and_registers_the_op():
    first = ops.load_op_library()
    assert ops.load_op_library() is first
    assert hasattr(first, "global_batch_slice")


def test_missing_library_says_how_to_build_it(tmp_path):
    with pytest.raises(ops.OpLibraryError, match=r"missing .*install\.sh"):
        ops.load_op_library(str(tmp_path / "_ops.so"))


def test_library_that_does_not_load_is_reported(tmp_path):
    broken = tmp_path / "_ops.so"
    broken.write_bytes(b"not a shared object")
    with pytest.raises(ops.OpLibraryError, match=r"Cannot load .*rebuild it"):
        ops.load_op_library(str(broken))


def _slices(cursor, global_batch, workers):
    return [tuple(int(t) for t in ops.global_batch_slice(cursor, global_batch, workers, rank))
            for rank in range(workers)]


@pytest.mark.parametrize("global_batch", [7, 8, 12, 64])
@pytest.mark.parametrize("workers", [1, 2, 3, 5])
def test_slices_cover_each_global_batch_exactly_once(global_batch, workers):
    for cursor in (0, 1, 9):
        covered = []
        for start, size in _slices(cursor, global_batch, workers):
            covered.extend(range(start, start + size))
        assert covered == list(range(cursor * global_batch, (cursor + 1) * global_batch))


def test_first_workers_take_the_remainder():
    assert _slices(2, 10, 3) == [(20, 4), (24, 3), (27, 3)]


def test_a_traced_function_follows_runtime_membership():
    workers = tf.Variable(3, dtype=tf.int64)
    rank = tf.Variable(2, dtype=tf.int64)
    traces = []

    @tf.function
    def my_slice(cursor):
        traces.append(1)
        return ops.global_batch_slice(cursor, 10, workers, rank)

    assert [int(t) for t in my_slice(tf.constant(1, tf.int64))] == [17, 3]
    workers.assign(2)
    rank.assign(1)
    assert [int(t) for t in my_slice(tf.constant(1, tf.int64))] == [15, 5]
    assert len(traces) == 1


@pytest.mark.parametrize("args, message", [
    ((0, 0, 2, 0), "global_batch_size must be positive"),
    ((0, 8, 0, 0), "num_workers must be positive"),
    ((0, 8, 2, 2), r"worker_index must be in \[0, 2\)"),
    ((0, 8, 2, -1), r"worker_index must be in \[0, 2\)"),
    ((0, 3, 4, 0), "smaller than the number of workers"),
    ((-1, 8, 2, 0), "cursor must be non-negative"),
])
def test_bad_arguments_are_rejected_clearly(args, message):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        ops.global_batch_slice(*args)


def test_cursor_overflow_is_an_error():
    with pytest.raises(tf.errors.OutOfRangeError, match="overflows int64"):
        ops.global_batch_slice(2**62, 8, 2, 0)


def test_non_scalar_inputs_fail_at_trace_time():
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)):
        tf.function(lambda: ops.global_batch_slice(tf.constant([0, 1], tf.int64), 8, 2, 0))()


def test_library_lives_inside_the_package():
    import tensorflow_elastic

    assert os.path.dirname(ops.LIBRARY_PATH) == os.path.dirname(tensorflow_elastic.__file__)


@pytest.mark.parametrize("position, name", [(0, "cursor"), (1, "global_batch_size"),
                                            (2, "num_workers"), (3, "worker_index")])
def test_a_non_scalar_eager_input_is_an_error_not_an_abort(position, name):
    """Eager calls skip the op's shape function: the kernel itself checks each input."""
    args = [tf.constant(0, tf.int64), tf.constant(8, tf.int64), tf.constant(2, tf.int64),
            tf.constant(0, tf.int64)]
    args[position] = tf.constant([1, 2], tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{name} must be a scalar"):
        ops.global_batch_slice(*args)


def test_a_non_scalar_snapshot_id_is_an_error_not_an_abort():
    with pytest.raises(tf.errors.InvalidArgumentError, match="snapshot id must be a scalar"):
        ops.load_op_library().elastic_variable_snapshot_values(tf.constant([1, 2], tf.int64),
                                                               [tf.float32])


def test_a_non_scalar_resource_is_an_error_not_an_abort():
    handles = tf.stack([tf.Variable(1.0).handle, tf.Variable(2.0).handle])
    with pytest.raises(tf.errors.InvalidArgumentError, match="must be a scalar handle"):
        ops.load_op_library().elastic_variable_snapshot([handles])
