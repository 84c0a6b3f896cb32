"""Fixtures of the PS tests."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_elastic.ps.config import PSConfig
from tensorflow_elastic.ps.server import ParameterServer


@pytest.fixture
def start_ps():
    """Starts parameter servers of one float32 variable [1, 1, 1, 1]; stops them after the test."""
    servers = []

    def start(config: PSConfig | None = None, **options) -> ParameterServer:
        server = ParameterServer([tf.Variable(np.ones(4, np.float32))],
                                 tf.keras.optimizers.SGD(0.1), config or PSConfig(policy="fifo"),
                                 lease_timeout=30.0, **options)
        servers.append(server.start())
        return server

    yield start
    for server in servers:
        server.stop()
