"""The C++ op library (`tensorflow_elastic/_ops.so`), loaded once, and its Python wrappers.

Stock kernels are used wherever TensorFlow has them; this library holds the
kernels TensorFlow lacks, and CPU kernels for AssignAdd/AssignSubVariableOp that
take precedence over TensorFlow's once the library is loaded: they write an
update of a buffer a snapshot shares in one pass instead of copying it first
(cc/kernels/one_pass_update_kernel.cc).
"""

from __future__ import annotations

import importlib.util
import os
import threading
from types import ModuleType

import tensorflow as tf

LIBRARY_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_ops.so")

_lock = threading.Lock()
_library: ModuleType | None = None
_binding: ModuleType | None = None


class OpLibraryError(ImportError):
    """The op library is missing or does not fit the installed TensorFlow."""


def load_op_library(path: str = LIBRARY_PATH) -> ModuleType:
    """Loads the op library once per process and returns its generated op module."""
    global _library
    with _lock:
        if _library is not None and path == LIBRARY_PATH:
            return _library
        if not os.path.exists(path):
            raise OpLibraryError(
                f"The tensorflow_elastic op library is missing ({path}). It is built with the "
                f"package: run ./install.sh from the source tree, or reinstall the wheel.")
        try:
            library = tf.load_op_library(path)
        except (tf.errors.NotFoundError, tf.errors.InvalidArgumentError, OSError) as e:
            raise OpLibraryError(
                f"Cannot load the tensorflow_elastic op library {path} with TensorFlow "
                f"{tf.__version__}: {e}. It was probably built for another TensorFlow; rebuild it "
                f"with ./install.sh.") from e
        if path == LIBRARY_PATH:
            _library = library
        return library


def load_binding() -> ModuleType:
    """The library's pybind11 module (`cc/python/`): variable snapshots, collective server updates.

    It is built into the op library, so it sees what the library's kernels registered.
    TensorFlow loads the library first (it collects the library's ops while loading it);
    importing the same file then finds the library already loaded.
    """
    global _binding
    load_op_library()
    with _lock:
        if _binding is None:
            spec = importlib.util.spec_from_file_location(f"{__package__}._binding", LIBRARY_PATH)
            try:
                binding = importlib.util.module_from_spec(spec)
            except ImportError as e:
                raise OpLibraryError(f"The op library {LIBRARY_PATH} lacks its Python binding "
                                     f"({e}); rebuild it with ./install.sh.") from e
            spec.loader.exec_module(binding)
            _binding = binding
        return _binding


# AutoGraph stays out of the wrappers: they load the library with plain Python.
@tf.autograph.experimental.do_not_convert
def global_batch_slice(cursor, global_batch_size, num_workers, worker_index):
    """This worker's slice [start, start + size) of global batch `cursor`.

    The first `global_batch_size % num_workers` workers take one element more,
    so the slices cover each global batch exactly once for any world size. All
    arguments may be tensors (e.g. variables the strategy updates when the
    membership changes), so a traced function follows the change.
    """
    ops = load_op_library()
    as_int64 = lambda value: tf.cast(value, tf.int64)
    return ops.global_batch_slice(as_int64(cursor), as_int64(global_batch_size),
                                  as_int64(num_workers), as_int64(worker_index))
