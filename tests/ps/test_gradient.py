"""The mean of a block of gradients."""

import numpy as np

from tensorflow_elastic.ps.gradient import Gradient, aggregate


def test_aggregate_is_the_mean_or_the_weighted_mean_in_the_gradients_dtype():
    block = [Gradient("a", 0, [np.array([1.0, 2.0], np.float32), np.array(4.0, np.float32)]),
             Gradient("b", 0, [np.array([3.0, 6.0], np.float32), np.array(0.0, np.float32)])]
    mean = aggregate(block)
    np.testing.assert_allclose(mean[0], [2.0, 4.0])
    np.testing.assert_allclose(mean[1], 2.0)
    assert [a.dtype for a in mean] == [np.float32, np.float32]
    weighted = aggregate(block, np.array([0.25, 0.75]))
    np.testing.assert_allclose(weighted[0], [2.5, 5.0])
    assert weighted[0].dtype == np.float32
    assert aggregate(block[:1])[0] is block[0].arrays[0]  # a block of one is not copied
