"""The TensorFlow side: the elastic strategy, its collectives, the commit vote, the sparse cluster
and the process's runtime (`init()`). Importing it registers the strategy under tf.distribute.experimental.
"""

import tensorflow as tf

from tensorflow_elastic.strategy.strategy import ElasticMultiWorkerMirroredStrategy

tf.distribute.experimental.ElasticMultiWorkerMirroredStrategy = ElasticMultiWorkerMirroredStrategy

__all__ = ["ElasticMultiWorkerMirroredStrategy"]
