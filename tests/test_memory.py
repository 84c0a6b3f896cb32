"""Large message buffers are reused instead of being faulted in afresh (glibc)."""

import ctypes.util
import os

import numpy as np
import pytest

from tensorflow_elastic.proto import parameter_server_pb2 as pb
from tensorflow_elastic.ps import tensors
from tensorflow_elastic.memory import (TENSOR_POOL_ENV, keep_large_buffers, limit_arenas,
                                      pool_tensors)


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


def test_arenas_are_capped_once_unless_the_user_chose_a_count(monkeypatch):
    limit_arenas.cache_clear()
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")
    assert limit_arenas() is False  # glibc already follows the user's setting
    limit_arenas.cache_clear()
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    expected = ctypes.util.find_library("c") is not None
    assert limit_arenas() is expected
    with pytest.raises(ValueError, match="arena count must be >= 1"):
        limit_arenas(0)


def test_tensors_are_pooled_unless_the_user_chose_an_allocator(monkeypatch):
    monkeypatch.setenv(TENSOR_POOL_ENV, "false")
    assert pool_tensors() is False
    assert os.environ[TENSOR_POOL_ENV] == "false"
    monkeypatch.delenv(TENSOR_POOL_ENV)
    assert pool_tensors() is True
    assert os.environ[TENSOR_POOL_ENV] == "true"
