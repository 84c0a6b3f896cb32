"""``tfe.ps.run``: one script for both roles, like the rest of tensorflow_elastic.

The launcher (``tfelastic-run --role ps|worker --ps_address HOST:PORT``)
tells each process its role and the PS address through the environment; the
same script then builds its model and calls :func:`run`, which serves it
(role ``ps``) or trains on local data (role ``worker``).
"""

from __future__ import annotations

import signal
from typing import Any, Callable, Iterable, Sequence

import tensorflow as tf

from tensorflow_elastic import environment, net
from tensorflow_elastic.ps.config import PSConfig
from tensorflow_elastic.ps.roles import PS, WORKER
from tensorflow_elastic.ps.server import ParameterServer
from tensorflow_elastic.ps.worker import GradientFn, PSWorker, WorkerResult
from tensorflow_elastic.rendezvous import auth



def keras_gradient_fn(model: Any, loss_fn: Callable[[Any, Any], Any]) -> GradientFn:
    """A traced ``(x, y) -> (loss, gradients)`` for a Keras model's trainable variables."""
    variables = model.trainable_variables

    @tf.function
    def gradient(x: Any, y: Any) -> tuple[Any, list[Any]]:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return loss, tape.gradient(loss, variables)

    return lambda batch: gradient(*batch)


def _resolve(model: Any, loss_fn: Any, variables: Sequence[Any] | None,
             gradient_fn: GradientFn | None) -> tuple[list[Any], GradientFn]:
    if model is not None:
        if variables is not None or gradient_fn is not None:
            raise ValueError("give either model (+ loss_fn) or variables + gradient_fn, not both")
        if not model.built or not model.trainable_variables:
            raise ValueError("build the model first (call it on a batch, or give its input shape) "
                             "so the PS and the workers agree on its variables")
        if loss_fn is None:
            raise ValueError("a Keras model needs loss_fn(y_true, y_pred)")
        return list(model.trainable_variables), keras_gradient_fn(model, loss_fn)
    if variables is None or gradient_fn is None:
        raise ValueError("give model and loss_fn, or variables and gradient_fn(batch) -> "
                         "(loss, gradients)")
    return list(variables), gradient_fn


def _on_sigterm(handler: Callable[[], None]) -> None:
    signal.signal(signal.SIGTERM, lambda signum, frame: handler())


def run(*, model: Any = None, loss_fn: Callable[[Any, Any], Any] | None = None,
        variables: Sequence[Any] | None = None, gradient_fn: GradientFn | None = None,
        optimizer: Any = None, dataset: Iterable[Any] | None = None,
        config: PSConfig | None = None, role: str | None = None, address: str | None = None,
        run_id: str | None = None, checkpoint_dir: str | None = None,
        checkpoint_every: int = 100, lease_timeout: float = 10.0, idle_timeout: float = 300.0,
        reconnect_timeout: float = 120.0, token: str | None = None,
        token_file: str | None = None, tls_cert_file: str | None = None,
        tls_key_file: str | None = None,
        tls_ca_file: str | None = None) -> dict[str, Any] | WorkerResult:
    """Serves the model (role ``ps``: returns the PS's final stats) or trains it (``worker``).

    The PS settings (``checkpoint_*``, ``lease_timeout``, ``idle_timeout``)
    are ignored by workers and ``reconnect_timeout`` by the PS, so one call
    serves both roles.

    ``token`` (else the first line of ``token_file``, else ``$TFE_RDZV_TOKEN``)
    is the shared token every call must carry. The PS serves TLS with
    ``tls_cert_file`` + ``tls_key_file``; workers trust ``tls_ca_file``.
    """
    role = role or environment.text(environment.PS_ROLE)
    address = address or environment.text(environment.PS_ADDRESS)
    run_id = run_id or environment.text(environment.RUN_ID, "default")
    if role not in (PS, WORKER):
        raise ValueError(f"role must be {PS!r} or {WORKER!r} (argument or "
                         f"${environment.PS_ROLE}), got {role!r}; start the script with "
                         f"tfelastic-run --role ps|worker")
    if not address:
        raise ValueError(f"no parameter server address: pass address= or set "
                         f"${environment.PS_ADDRESS} (tfelastic-run --ps_address HOST:PORT)")
    variables, gradient_fn = _resolve(model, loss_fn, variables, gradient_fn)
    token = token or auth.load_token(token_file)
    if role == PS:
        if optimizer is None:
            raise ValueError("the parameter server needs the optimizer that applies gradients")
        host, port = net.parse_address(address, allow_port_zero=True)
        server = ParameterServer(variables, optimizer, config, host=host, port=port,
                                 run_id=run_id,
                                 checkpoint_dir=checkpoint_dir or environment.text(environment.PS_CHECKPOINT_DIR),
                                 checkpoint_every=checkpoint_every, lease_timeout=lease_timeout,
                                 idle_timeout=idle_timeout, token=token,
                                 tls_cert_file=tls_cert_file, tls_key_file=tls_key_file)
        server.start()
        print(f"parameter server for run {run_id!r} listening on {server.address}", flush=True)
        _on_sigterm(server.stop)
        try:
            server.wait()
        finally:
            server.stop()
        return server.stats()
    if dataset is None:
        raise ValueError("a worker needs its dataset (an iterable of batches)")
    worker = PSWorker(address, variables, gradient_fn, run_id=run_id,
                      reconnect_timeout=reconnect_timeout, token=token,
                      tls_ca_file=tls_ca_file or environment.text(environment.TLS_CA))
    _on_sigterm(worker.request_stop)
    return worker.run(dataset)
