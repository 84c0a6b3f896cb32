"""Asynchronous parameter-server mode: a PS applies workers' gradients in the order a policy chooses.

PS: server (lifecycle, events, checkpoints) over parameters, registry and master (the loop, with
gradient, policies, stats); service + errors speak gRPC. Workers: worker, client. Both: api, cli,
divergence (how a job whose loss became NaN or Inf says so).

Names load on first use, so the launcher can read the role settings
(:mod:`tensorflow_elastic.ps.roles`) without importing TensorFlow.
"""

import importlib

_LAZY = {
    "PSConfig": "tensorflow_elastic.ps.config",
    "POLICIES": "tensorflow_elastic.ps.config",
    "Master": "tensorflow_elastic.ps.master",
    "Gradient": "tensorflow_elastic.ps.gradient",
    "ParameterServer": "tensorflow_elastic.ps.server",
    "PSWorker": "tensorflow_elastic.ps.worker",
    "WorkerResult": "tensorflow_elastic.ps.worker",
    "PSClient": "tensorflow_elastic.ps.client",
    "PSError": "tensorflow_elastic.ps.errors",
    "CheckpointError": "tensorflow_elastic.ps.checkpoint",
    "TrainingDiverged": "tensorflow_elastic.errors",
    "run": "tensorflow_elastic.ps.api",
    "keras_gradient_fn": "tensorflow_elastic.ps.api",
    "ROLE_ENV": "tensorflow_elastic.ps.roles",
    "ADDRESS_ENV": "tensorflow_elastic.ps.roles",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tensorflow_elastic.ps' has no attribute '{name}'")
    return getattr(importlib.import_module(module), name)


__all__ = list(_LAZY)
