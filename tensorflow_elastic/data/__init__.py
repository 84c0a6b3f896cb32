"""Elastic input: each worker's slice of a constant global batch, resharded at runtime.

TFRecord pipelines as users write them are read by record index (tfrecord, addressable).
See docs/elastic_input.md for the design (cursor, prefetch, partial batches).
"""

from tensorflow_elastic.data.elastic_dataset import ElasticDataset, elastic_dataset
from tensorflow_elastic.data.sources import indexed_records
from tensorflow_elastic.data.tfrecord import tfrecord_records

__all__ = ["ElasticDataset", "elastic_dataset", "indexed_records", "tfrecord_records"]
