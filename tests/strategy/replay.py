"""The elastic test worker's training (elastic_worker.py) replayed in one process with numpy: its
weights after a number of global batches, each trained on exactly once."""

from __future__ import annotations

import numpy as np

GLOBAL_BATCH, FEATURES, EXAMPLES, LEARNING_RATE = 12, 8, 4096, 0.05


def replay(steps: int) -> list[float]:
    """The weights and bias (as elastic_worker.py prints them) after global batches 0..steps-1."""
    rng = np.random.RandomState(0)
    x_all = rng.randn(EXAMPLES, FEATURES).astype(np.float32)
    y_all = x_all @ rng.randn(FEATURES, 1).astype(np.float32) + 0.5
    w, b = np.zeros([FEATURES, 1], np.float64), 0.0
    for step in range(steps):
        index = np.arange(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH) % EXAMPLES
        x, y = x_all[index].astype(np.float64), y_all[index].astype(np.float64)
        error = x @ w + b - y
        w -= LEARNING_RATE * 2 * x.T @ error / GLOBAL_BATCH
        b -= LEARNING_RATE * 2 * float(error.sum()) / GLOBAL_BATCH
    return [float(v) for v in w.reshape(-1)] + [b]
