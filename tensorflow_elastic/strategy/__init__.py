"""The elastic distribution strategy; importing it registers it under tf.distribute.experimental."""

import tensorflow as tf

from tensorflow_elastic.strategy.strategy import ElasticMultiWorkerMirroredStrategy

tf.distribute.experimental.ElasticMultiWorkerMirroredStrategy = ElasticMultiWorkerMirroredStrategy

__all__ = ["ElasticMultiWorkerMirroredStrategy"]
