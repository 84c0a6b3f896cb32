"""A diverged job in words: what became NaN or Inf, where, and what to change.

The worker that sees it and the PS that refuses it word it the same way, so
the user reads one message whichever process reports it. No TensorFlow here.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from tensorflow_elastic.ps import tensors
from tensorflow_elastic.ps.config import SYNCH


def loss_diverged(loss: float) -> str:
    return f"loss became {loss}"


def gradient_diverged(name: str) -> str:
    return f"gradient for {name} has NaN or Inf values"


def what_diverged(loss: float | None, gradients: Sequence[np.ndarray],
                  names: Sequence[str]) -> str | None:
    """What became NaN or Inf, the loss first; None when everything is finite."""
    if loss is not None and not math.isfinite(loss):
        return loss_diverged(loss)
    bad = tensors.first_non_finite(gradients)
    return None if bad is None else gradient_diverged(names[bad])


def report(where: str, policy: str) -> str:
    """The whole message: ``where`` says what became non-finite and when."""
    advice = ("lower the learning rate" if policy == SYNCH else
              "lower the learning rate or bound the staleness with max_staleness "
              "(ps.PSConfig(max_staleness=N), or tfelastic ps-configure --max_staleness N)")
    return f"the training diverged: the {where} under policy {policy}; {advice}"
