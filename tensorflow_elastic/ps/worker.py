"""A PS worker's loop: pull parameters, compute a gradient on local data, push it.

In the synchronous policy each worker computes exactly one gradient per
version and counts its own iterations; in the asynchronous policies it
always works on the newest parameters it can get and runs until the PS says
stop (or its data ends). A preemption notice (``request_stop``) ends the
loop at an iteration boundary, after the gradient in flight was pushed. A
loss or gradient that becomes NaN or Inf ends the job with
:class:`TrainingDiverged`: pushed once so the PS refuses it and stops every
worker, then raised with where it happened and what to change.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import tensorflow as tf

from tensorflow_elastic.errors import TrainingDiverged
from tensorflow_elastic.ps import divergence, tensors
from tensorflow_elastic.ps.client import PSClient
from tensorflow_elastic.ps.config import SYNCH
from tensorflow_elastic.ps.errors import FUTURE_VERSION, PSError
from tensorflow_elastic.ps.master import STOP_DIVERGED
from tensorflow_elastic.ps.parameters import variable_specs

logger = logging.getLogger(__name__)

GradientFn = Callable[[Any], tuple[Any, Sequence[Any]]]
_SYNCH_WAIT_S = 5.0
# A pull that returned sooner without a new version found no free wait slot: pause, then ask again.
_REPOLL_S = 0.1
# WorkerResult.reason values the worker acts on.
STOP_REQUESTED = "stop requested"
STOPPED_BY_PS = "stopped by the parameter server"
_NO_BATCH = object()


@dataclasses.dataclass
class WorkerResult:
    worker_id: str
    iterations: int
    last_loss: float | None
    version: int
    reason: str


class PSWorker:
    """Trains ``variables`` (a local copy of the PS's) with ``gradient_fn(batch) -> (loss, grads)``.

    ``progress_timeout`` bounds how long the worker waits, in the synchronous
    policy, for the PS to publish the next version. ``token`` and
    ``tls_ca_file`` are the PS's shared token and the PEM to trust for TLS;
    messages are bounded by the model's size.
    """

    def __init__(self, address: str, variables: Sequence[Any], gradient_fn: GradientFn, *,
                 run_id: str = "default", reconnect_timeout: float = 120.0,
                 progress_timeout: float = 600.0, token: str | None = None,
                 tls_ca_file: str | None = None):
        self.variables = list(variables)
        self.gradient_fn = gradient_fn
        self.client = PSClient(address, run_id, reconnect_timeout=reconnect_timeout, token=token,
                               tls_ca_file=tls_ca_file,
                               max_message_bytes=tensors.message_limit(
                                   variable_specs(self.variables)))
        self.progress_timeout = progress_timeout
        self._stop_requested = threading.Event()
        self._heartbeats_done = threading.Event()

    def request_stop(self) -> None:
        """Leave at the next iteration boundary (e.g. on a preemption notice)."""
        self._stop_requested.set()

    def _check_variables(self) -> None:
        remote = [(s.dtype, list(s.shape)) for s in self.client.registration.variables]
        local = [(s.dtype, list(s.shape)) for s in variable_specs(self.variables)]
        if remote != local:
            raise ValueError(f"this worker's model does not match the parameter server's: "
                             f"local variables {local}, PS variables {remote}; build the same "
                             f"model on both")

    def _heartbeat_loop(self, interval: float) -> None:
        while not self._heartbeats_done.wait(interval):
            try:
                self.client.heartbeat()
            except Exception as e:  # the training loop reports real trouble itself
                logger.debug("heartbeat failed: %s", e)

    def _assign(self, parameters: Sequence[Any]) -> None:
        for variable, tensor in zip(self.variables, parameters):
            variable.assign(tensors.decode(tensor))

    def run(self, batches: Iterable[Any]) -> WorkerResult:
        """Trains until the PS says stop, the data ends or a stop is requested.

        Raises :class:`TrainingDiverged` when this worker's loss or a gradient
        becomes NaN or Inf (the PS refuses it and ends the job), or when the PS
        ended the job because another worker's did.
        """
        registration = self.client.register()
        self._check_variables()
        heartbeat = threading.Thread(target=self._heartbeat_loop,
                                     args=(max(0.05, registration.lease_seconds / 4),),
                                     name="ps-heartbeat", daemon=True)
        heartbeat.start()
        try:
            try:
                result = self._train(self._warm_up(iter(batches)), registration)
            finally:
                self._heartbeats_done.set()
                heartbeat.join(timeout=5)
            if result.reason == STOPPED_BY_PS:
                self._raise_if_diverged()
            self.client.leave(finished=result.reason != STOP_REQUESTED, reason=result.reason)
            return result
        except TrainingDiverged:
            self._leave_diverged()
            raise
        finally:
            self.client.close()

    def _warm_up(self, batches: Iterator[Any]) -> Iterator[Any]:
        """Computes one gradient before the first pull, and gives the batch back to the loop.

        The first call traces ``gradient_fn`` (seconds): made on pulled
        parameters, it would push a gradient as stale as the updates the other
        workers made meanwhile.
        """
        first = next(batches, _NO_BATCH)
        if first is _NO_BATCH:
            return batches
        self.gradient_fn(first)
        return itertools.chain([first], batches)

    def _train(self, batches: Iterable[Any], registration: Any) -> WorkerResult:
        synch = registration.policy == SYNCH
        limit = registration.iterations or None
        names = [spec.name for spec in registration.variables]
        version, iterations, last_loss, reason = -1, 0, None, "data exhausted"
        for batch in batches:
            if self._stop_requested.is_set():
                reason = STOP_REQUESTED
                break
            if limit is not None and iterations >= limit:
                reason = "iterations done"
                break
            pulled = self._pull(version, synch and version >= 0)
            if pulled.stop:
                reason = STOPPED_BY_PS
                break
            if pulled.parameters:
                self._assign(pulled.parameters)
                version = pulled.version
            loss, gradients = self.gradient_fn(batch)
            arrays = [_to_array(g, v) for g, v in zip(gradients, self.variables)]
            last_loss = float(loss)
            diverged = divergence.what_diverged(last_loss, arrays, names)
            if diverged is not None:
                self._report(version, arrays, batch, last_loss)
                raise TrainingDiverged(divergence.report(
                    f"{diverged} at iteration {iterations + 1} (parameter version {version})",
                    registration.policy))
            try:
                pushed = self.client.push(version, arrays, samples=_samples(batch),
                                          loss=last_loss)
            except PSError as e:
                if e.reason != FUTURE_VERSION:
                    raise
                # The PS restarted from a checkpoint older than our parameters: this
                # gradient is lost; start again from the PS's version.
                logger.warning("parameter server went back to an older version (%s)", e.message)
                version = -1
                continue
            iterations += 1
            if pushed.stop:
                reason = STOPPED_BY_PS
                break
        else:
            if limit is not None and iterations >= limit:
                reason = "iterations done"
        return WorkerResult(self.client.worker_id, iterations, last_loss, version, reason)

    def _report(self, version: int, arrays: list[np.ndarray], batch: Any, loss: float) -> None:
        """Pushes a NaN or Inf loss or gradient: the PS refuses it and ends the job for all."""
        try:
            self.client.push(version, arrays, samples=_samples(batch), loss=loss)
        except PSError as e:
            logger.debug("the parameter server refused the diverged gradient: %s", e)

    def _leave_diverged(self) -> None:
        try:
            self.client.leave(finished=True, reason="diverged")
        except PSError as e:  # the job ends either way; the divergence is what to report
            logger.debug("leaving after the divergence failed: %s", e)

    def _raise_if_diverged(self) -> None:
        """The PS stopped the job: a divergence elsewhere ends this worker with its report."""
        status = self.client.status()
        if status.stop_reason == STOP_DIVERGED:
            message = json.loads(status.stats_json).get("stop_message") or "the training diverged"
            raise TrainingDiverged(f"stopped by the parameter server: {message}")

    def _pull(self, version: int, wait_for_next: bool):
        """The newest parameters; in the synchronous policy, those after our last gradient."""
        if not wait_for_next:
            return self.client.pull(have_version=version)
        started = time.monotonic()
        while True:
            asked = time.monotonic()
            pulled = self.client.pull(have_version=version, min_version=version + 1,
                                      wait_seconds=_SYNCH_WAIT_S)
            if pulled.stop or pulled.version > version or self._stop_requested.is_set():
                return pulled
            waited = time.monotonic() - started
            if waited >= self.progress_timeout:
                raise TimeoutError(f"the parameter server published no version after {version} "
                                   f"for {waited:.0f} s; is it stuck on a missing worker?")
            if time.monotonic() - asked < _REPOLL_S:
                time.sleep(_REPOLL_S)


def _to_array(gradient: Any, variable: Any) -> np.ndarray:
    if gradient is None:
        return np.zeros(tuple(variable.shape), np.dtype(tf.as_dtype(variable.dtype).as_numpy_dtype))
    if isinstance(gradient, tf.IndexedSlices):
        gradient = tf.convert_to_tensor(gradient)
    return np.asarray(gradient)


def _samples(batch: Any) -> int:
    first = tf.nest.flatten(batch)[0]
    shape = getattr(first, "shape", ())
    return int(shape[0]) if len(shape) > 0 and shape[0] is not None else 1
