"""The devices a worker drives (its local replicas) and where its replicas stand in the job's.

A worker drives k local replicas: its GPUs when it has some (as stock
MultiWorkerMirroredStrategy), its CPU otherwise, or an explicit list (logical
CPUs for tests, a subset of GPUs). Workers may drive different numbers of
replicas; the job's replicas are ordered by member (lowest id first), then by
local device. Pure functions: the strategy asks TensorFlow for the GPU count.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from tensorflow.python.framework import device as device_lib


def local_devices(worker_device: str, devices: Sequence[str] | None,
                  num_gpus: int) -> tuple[tuple[str, ...], str]:
    """(the worker's replica devices, fully qualified, and their type).

    `devices`: an explicit list ("GPU:0", "/device:CPU:1", ...), all of one type; None: every
    GPU (`num_gpus` of them), or the CPU when there is none.
    """
    if devices is None:
        kind, indices = ("GPU", range(num_gpus)) if num_gpus else ("CPU", range(1))
        return tuple(f"{worker_device}/device:{kind}:{i}" for i in indices), kind
    if isinstance(devices, str) or not devices:
        raise ValueError(f"devices must be a non-empty list of device names, got {devices!r}")
    specs = [device_lib.DeviceSpec.from_string(name) for name in devices]
    kinds = {(spec.device_type or "").upper() for spec in specs}
    if len(kinds) != 1 or "" in kinds or any(spec.device_index is None for spec in specs):
        raise ValueError(f"devices must name devices of one type with their index "
                         f"(e.g. ['GPU:0', 'GPU:1']), got {list(devices)}")
    qualified = tuple(f"{worker_device}/device:{spec.device_type.upper()}:{spec.device_index}"
                      for spec in specs)
    if len(set(qualified)) != len(qualified):
        raise ValueError(f"devices lists a device twice: {list(devices)}")
    return qualified, kinds.pop()


def replica_layout(counts: Mapping[int, int], node_id: int) -> tuple[int, int]:
    """(the job's replicas, the index of `node_id`'s first one), from each member's count."""
    ordered = sorted(counts)
    return sum(counts.values()), sum(counts[member] for member in ordered
                                     if member < node_id)

