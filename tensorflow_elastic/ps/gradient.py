"""A worker's gradient as the master holds it, and the mean of a block of them.

Kept apart from the master so the policies, which order gradients, and the
service, which builds them from requests, need not import the master loop.
No TensorFlow here: gradients are numpy arrays.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np


@dataclasses.dataclass
class Gradient:
    """One worker's gradient, computed on parameter ``version``."""

    worker: str
    version: int
    arrays: list[np.ndarray]   # one per variable; the server has checked shapes and dtypes
    samples: int = 1           # samples behind this gradient (wskew)
    loss: float | None = None
    sequence: int = 0          # arrival order, set by Master.submit


def aggregate(block: Sequence[Gradient], weights: np.ndarray | None = None) -> list[np.ndarray]:
    """The (weighted) mean of the block, variable by variable, in the gradients' dtype.

    A block of one is returned as is: no copy on the common path of one
    gradient per update.
    """
    if len(block) == 1:
        return list(block[0].arrays)
    if weights is None:
        weights = np.full(len(block), 1.0 / len(block))
    result = []
    for parts in zip(*(g.arrays for g in block)):
        total = parts[0] * parts[0].dtype.type(weights[0])
        for part, weight in zip(parts[1:], weights[1:]):
            total += part * part.dtype.type(weight)
        result.append(np.asarray(total))
    return result
