"""Large message buffers are reused instead of being faulted in afresh (glibc)."""

import ctypes.util

import numpy as np
import pytest

from tensorflow_elastic.proto import parameter_server_pb2 as pb
from tensorflow_elastic.ps import tensors
from tensorflow_elastic.ps.memory import keep_large_buffers


@pytest.mark.skipif(ctypes.util.find_library("c") is None, reason="needs a C library")
def test_malloc_is_tuned_once_and_a_large_push_still_round_trips():
    assert keep_large_buffers() is True
    assert keep_large_buffers.cache_info().currsize == 1
    gradient = np.arange(1_000_000, dtype=np.float32)
    for _ in range(3):
        request = pb.PushRequest(version=1)
        tensors.encode_into(request.gradients, [gradient])
        wire = request.SerializeToString()
    back = tensors.decode(pb.PushRequest.FromString(wire).gradients[0])
    np.testing.assert_array_equal(back, gradient)
