"""Which GPUs each of a launcher's workers sees: one worker per GPU (torchrun's usual shape), or
one worker that drives them all (stock MultiWorkerMirroredStrategy's).

A pure decision (`worker_gpu_env`) on the GPUs the launcher sees (`visible_gpus`, read from
its environment and the NVIDIA driver). Beside TFE_LOCAL_RANK every worker gets torchrun's
LOCAL_RANK, which scripts written for torchrun read to pick their device.
"""

from __future__ import annotations

import os
from typing import Mapping

# --gpus: each worker its share of the GPUs, or every worker all of them.
SPLIT = "split"
ALL = "all"
PLACEMENTS = (SPLIT, ALL)

_DRIVER_GPUS = "/proc/driver/nvidia/gpus"


def visible_gpus(environ: Mapping[str, str] = os.environ, driver_dir: str = _DRIVER_GPUS
                 ) -> list[str]:
    """The GPUs this launcher may hand out, as CUDA_VISIBLE_DEVICES names them: the launcher's
    own CUDA_VISIBLE_DEVICES when set (an empty one: none), else one per GPU the NVIDIA driver
    lists (none without the driver)."""
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [gpu.strip() for gpu in listed.split(",") if gpu.strip() and gpu.strip() != "-1"]
    try:
        return [str(i) for i in range(len(os.listdir(driver_dir)))]
    except OSError:
        return []


def worker_gpu_env(slot: int, nproc_per_node: int, gpus: list[str],
                   placement: str = SPLIT) -> dict[str, str]:
    """The environment worker `slot` of `nproc_per_node` gets for the launcher's `gpus`.

    SPLIT: each worker sees its contiguous share, len(gpus) // nproc_per_node GPUs (one each
    when they are as many), through CUDA_VISIBLE_DEVICES; with fewer GPUs than workers,
    worker i shares GPU i % len(gpus). ALL, or no GPU: CUDA_VISIBLE_DEVICES is left as it is
    (the worker drives every GPU it sees, one replica each). LOCAL_RANK always.
    """
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    if not 0 <= slot < nproc_per_node:
        raise ValueError(f"slot {slot} is not in [0, {nproc_per_node})")
    env = {"LOCAL_RANK": str(slot)}
    if placement == ALL or not gpus:
        return env
    if len(gpus) < nproc_per_node:
        env["CUDA_VISIBLE_DEVICES"] = gpus[slot % len(gpus)]
        return env
    share = len(gpus) // nproc_per_node
    env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[slot * share:(slot + 1) * share])
    return env
