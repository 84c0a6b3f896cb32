"""The guard on TensorFlow's (and Keras') private internals that the package relies on.

TensorFlow promises nothing about names with a leading underscore. A release
that renamed one would otherwise show as an AttributeError deep inside a
training step or, for a private method the elastic strategy overrides, as an
override that silently stops being called. Reached through here, a missing
internal fails where it is first needed (most of them when the module that
uses them loads), naming the internal, the installed release and the releases
the package was checked against. docs/compatibility.md lists every one.
"""

from __future__ import annotations

import importlib
import types
from typing import Any

from tensorflow_elastic.tf_version import SUPPORTED_RELEASES


class TensorFlowInternalsError(ImportError):
    """The installed TensorFlow or Keras lacks an internal the package relies on."""


def _owner_name(owner: Any) -> str:
    if isinstance(owner, type):
        return f"{owner.__module__}.{owner.__qualname__}"
    if isinstance(owner, types.ModuleType):
        return owner.__name__
    return f"{type(owner).__module__}.{type(owner).__qualname__} object"


def _release_of(owner_name: str) -> str:
    """"TensorFlow 2.21.0" or "Keras 3.15.1": the release the owner comes from."""
    root = owner_name.split(".", 1)[0]
    version = getattr(importlib.import_module(root), "__version__", "of unknown version")
    return f"{'Keras' if root in ('keras', 'tf_keras') else 'TensorFlow'} {version}"


def _missing(where: str, name: str) -> TensorFlowInternalsError:
    return TensorFlowInternalsError(
        f"tensorflow_elastic relies on the private {where}.{name}, which {_release_of(where)} "
        f"does not have; it was checked against TensorFlow {' and '.join(SUPPORTED_RELEASES)} "
        f"(docs/compatibility.md)")


def private(owner: Any, name: str) -> Any:
    """``owner.name`` (a TensorFlow module, class or object), or an error naming what moved."""
    try:
        return getattr(owner, name)
    except AttributeError:
        raise _missing(_owner_name(owner), name) from None


def require(owner: Any, *names: str) -> None:
    """Checks that ``owner`` has the private ``names``: the methods a subclass overrides or
    calls, the attributes it reads, so that a moved one fails at once rather than silently."""
    for name in names:
        private(owner, name)


def require_read(cls: type, *names: str) -> None:
    """Checks that the methods of ``cls`` still read the instance attributes ``names``, which a
    subclass turns into properties: a release that renamed one would bypass the property."""
    read = set()
    for member in vars(cls).values():
        code = getattr(getattr(member, "fget", member), "__code__", None)
        if code is not None:
            read.update(code.co_names)
    for name in names:
        if name not in read:
            raise _missing(_owner_name(cls), name)
