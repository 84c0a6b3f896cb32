"""The seed's entry point, kept verbatim: ``python -m tensorflow_elastic.distributed.launch``.

The launcher itself lives in :mod:`tensorflow_elastic.launch`.
"""
