"""Exceptions the elastic runtime raises, and which TensorFlow errors it can recover from."""

from __future__ import annotations


class MembershipChanged(Exception):
    """Raised at a commit boundary on every member at once: the group re-forms (growth or a leave)."""


class ElasticJobFailed(RuntimeError):
    """The job cannot go on (e.g. fewer than min_nodes for too long); the message says why."""


def is_recoverable(error: BaseException) -> bool:
    """Collective failures that a re-form with the surviving members repairs."""
    import tensorflow as tf

    return isinstance(error, (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                              tf.errors.AbortedError, tf.errors.CancelledError))
