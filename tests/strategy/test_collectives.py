"""The state broadcast's pieces that need no cluster: chunking, and tracing ahead of a join."""

import tensorflow as tf

from tensorflow_elastic.strategy import collectives


def _broadcaster(chunk_bytes=16):
    return collectives.VariableBroadcaster("/device:CPU:0",
                                           collectives.RuntimeInt(2, "test_group_size"),
                                           collectives.RuntimeInt(7, "test_group_key"),
                                           chunk_bytes=chunk_bytes)


def test_chunks_cover_each_variable_exactly_once():
    broadcaster = _broadcaster(chunk_bytes=16)
    assert broadcaster.chunks(tf.Variable(tf.zeros([3, 3]))) == [(0, 4), (4, 8), (8, 9)]
    assert broadcaster.chunks(tf.Variable(tf.zeros([2], tf.float64))) == [(0, 2)]
    assert broadcaster.chunks(tf.Variable(tf.zeros([0]))) == []
    assert broadcaster.chunks(tf.Variable(True)) == [(0, 1)]


def test_a_joining_node_traces_the_receiving_function_once_ahead_of_its_first_sync():
    broadcaster = _broadcaster()
    variables = [tf.Variable(tf.zeros([5])), tf.Variable(0, dtype=tf.int64)]
    broadcaster.prepare(variables, is_source=False)
    broadcaster.prepare(variables, is_source=False)
    receive = broadcaster._function(variables, is_source=False)
    assert receive.experimental_get_tracing_count() == 1
    # The sending side is another function, traced only when first needed.
    assert broadcaster._function(variables, is_source=True).experimental_get_tracing_count() == 0
