"""The state broadcast's pieces that need no cluster: chunking, and tracing ahead of a join."""

import tensorflow as tf

from tensorflow_elastic.strategy import collectives


def _broadcaster(chunk_bytes=16):
    return collectives.VariableBroadcaster("/device:CPU:0", chunk_bytes=chunk_bytes)


def test_chunks_cover_each_variable_exactly_once():
    broadcaster = _broadcaster(chunk_bytes=16)
    assert broadcaster.chunks(tf.Variable(tf.zeros([3, 3]))) == [(0, 4), (4, 8), (8, 9)]
    assert broadcaster.chunks(tf.Variable(tf.zeros([2], tf.float64))) == [(0, 2)]
    assert broadcaster.chunks(tf.Variable(tf.zeros([0]))) == []
    assert broadcaster.chunks(tf.Variable(True)) == [(0, 1)]


def test_a_joining_node_traces_the_receiving_function_once_ahead_of_its_first_sync():
    broadcaster = _broadcaster()
    variables = [tf.Variable(tf.ones([5])), tf.Variable(3, dtype=tf.int64)]
    broadcaster.prepare(variables, is_source=False)
    broadcaster.prepare(variables, is_source=False)
    # Preparing runs the function, receiving nothing.
    assert [v.numpy().tolist() for v in variables] == [[1.0] * 5, 3]
    receive = broadcaster._function(variables, is_source=False)
    assert receive.experimental_get_tracing_count() == 1
    # The sending side is another function, traced only when first needed.
    assert broadcaster._function(variables, is_source=True).experimental_get_tracing_count() == 0


def test_a_broadcast_runs_the_side_prepared_for_it_and_traces_nothing_more():
    traced, calls = [], []

    class Recording(collectives.VariableBroadcaster):
        def _trace(self, variables, is_source):
            traced.append(is_source)
            return lambda active: calls.append((is_source, bool(active.numpy())))

    broadcaster = Recording("/device:CPU:0")
    variables = [tf.Variable(tf.ones([2]))]
    broadcaster.prepare(variables, is_source=False)
    broadcaster.prepare(variables, is_source=True)
    broadcaster.prepare(variables, is_source=True)  # once
    broadcaster.broadcast(variables, True, 2, 7)
    broadcaster.broadcast(variables, False, 2, 7)
    assert traced == [False, True]
    assert calls == [(False, False), (True, False), (True, True), (False, True)]


def test_small_variables_of_a_dtype_share_transfers_and_large_ones_go_in_chunks():
    broadcaster = _broadcaster(chunk_bytes=16)
    variables = [tf.Variable(tf.zeros([2])), tf.Variable(tf.zeros([5])),  # 8 B, 20 B (chunked)
                 tf.Variable(0, dtype=tf.int64), tf.Variable(tf.zeros([1])),  # 8 B, 4 B
                 tf.Variable(tf.zeros([0])), tf.Variable(tf.zeros([3]))]  # none, 12 B (a new one)
    assert broadcaster.transfers(variables) == [
        [(0, 0, 2), (3, 0, 1)], [(1, 0, 4)], [(1, 4, 5)], [(2, 0, 1)], [(5, 0, 3)]]
