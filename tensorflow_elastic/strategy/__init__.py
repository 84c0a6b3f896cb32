"""The TensorFlow side: the elastic strategy, its collectives, the commit vote, the sparse cluster,
the aborts of ended generations' collectives, and the process's runtime (`init()`), which owns the
re-form protocol (`tfe.run`'s loop: commit, recover, re-form, sync) and sorts errors with a pure
decision (decision.py). Importing it registers the strategy under tf.distribute.experimental.
"""

import tensorflow as tf

from tensorflow_elastic.strategy.strategy import ElasticMultiWorkerMirroredStrategy

tf.distribute.experimental.ElasticMultiWorkerMirroredStrategy = ElasticMultiWorkerMirroredStrategy

__all__ = ["ElasticMultiWorkerMirroredStrategy"]
