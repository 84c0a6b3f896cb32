"""The TensorFlow side of a generation: a sparse cluster of permanent ids.

A process keeps its task id (its orchestrator node id) for life, so variables
placed on `/job:worker/replica:0/task:<id>` stay valid across generations. A
membership change updates the running server in place with the new ServerDef
and gives it new collective executors. Not through `enable_collective_ops`,
which would also drop every instantiated function (the next call of a
training step optimizes and instantiates it again: about 0.5 s for a 100 MB
transformer, seconds for a ResNet-50), but through the op library's binding
(`cc/python/collective_server.h`), which keeps them.

The server listens on the process's own address only (`cc/python/bound_server.cc`),
not on every interface as TensorFlow's own does: it takes no credentials, so it
must not be reachable on the host's other networks. An address given as a host
name keeps TensorFlow's every-interface server: a name may resolve here to
another address (127.0.1.1) than the one the peers reach.
"""

from __future__ import annotations

import concurrent.futures
import ipaddress
from typing import Mapping

from tensorflow.core.protobuf import config_pb2, tensorflow_server_pb2
from tensorflow.python.eager import context
from tensorflow.python.training import server_lib

from tensorflow_elastic import net
from tensorflow_elastic.ops import load_binding
from tensorflow_elastic.tf_internals import private

JOB_NAME = "worker"
# The op library's server that listens on the task's own address (cc/python/bound_server.cc).
BOUND_PROTOCOL = "grpc+tfe_bound"


def task_device(node_id: int) -> str:
    return f"/job:{JOB_NAME}/replica:0/task:{node_id}"


def leader(members: Mapping[int, str]) -> str:
    """The collective group leader: the lowest id present (the chief)."""
    return task_device(min(members))


def server_def(members: Mapping[int, str], node_id: int,
               config: config_pb2.ConfigProto | None = None) -> tensorflow_server_pb2.ServerDef:
    if node_id not in members:
        raise ValueError(f"node {node_id} is not among the members {sorted(members)}")
    session_config = config_pb2.ConfigProto()
    if config is not None:
        session_config.CopyFrom(config)
    # Without the leader in the ServerDef every collective of the group waits
    # for a leader that never answers.
    session_config.experimental.collective_group_leader = leader(members)
    cluster = server_lib.ClusterSpec({JOB_NAME: dict(members)}).as_cluster_def()
    return tensorflow_server_pb2.ServerDef(cluster=cluster, job_name=JOB_NAME, task_index=node_id,
                                           protocol=protocol(members[node_id]),
                                           default_session_config=session_config)


def protocol(address: str) -> str:
    """The server for a task at ``address``: one bound to it when it is an IP address."""
    host, _ = net.parse_address(address, allow_port_zero=True)
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return "grpc"
    return BOUND_PROTOCOL


def configure(node_id: int) -> None:
    """Prepares TensorFlow for collectives; must run before the first TensorFlow op.

    The leader given here is provisional: each ServerDef names the real one.
    """
    try:
        context.context().configure_collective_ops(
            collective_leader=task_device(node_id),
            scoped_allocator_enabled_ops=("CollectiveReduce",),
            device_filters=(task_device(node_id),))
    except RuntimeError as e:
        raise RuntimeError(
            "TensorFlow ran an op before tensorflow_elastic.init(); call init() (or create the "
            "ElasticMultiWorkerMirroredStrategy) at the start of the program, before building "
            "datasets or tensors") from e


def local_devices_config() -> config_pb2.ConfigProto:
    """The process's device setup (logical CPUs, GPU visibility and virtual GPUs) for its
    server: the server creates the devices of every ServerDef it is given from that
    ServerDef's session config, so without it a worker would have one CPU and every GPU
    (stock MultiWorkerMirroredStrategy copies the whole context config there)."""
    config = context.context().config
    return config_pb2.ConfigProto(device_count=config.device_count,
                                  gpu_options=config.gpu_options)


def start(members: Mapping[int, str], node_id: int) -> None:
    """Starts this process's server for its first generation (or its standby cluster of one)."""
    ctx = context.context()
    binding = load_binding()  # before the server: the library registers the bound one
    ctx.enable_collective_ops(server_def(members, node_id, local_devices_config()))
    ctx.ensure_initialized()
    binding.forward_collectives(private(ctx, "_handle"))


def update(members: Mapping[int, str], node_id: int) -> None:
    """Moves the running server to a new membership; variables and instantiated functions stay."""
    load_binding().update_collective_server(private(context.context(), "_handle"),
                                            server_def(members, node_id,
                                                       local_devices_config()).SerializeToString())


def _context_handle() -> object | None:
    """The eager context's handle; None before TensorFlow initialized it (no collective can
    have started)."""
    return private(context.context(), "_context_handle")


def abort_collectives(reason: str) -> None:
    """Unblocks every collective waiting on a peer that is gone; the next update() recovers.

    Without holding the interpreter lock (TensorFlow's own binding holds it)."""
    handle = _context_handle()
    if handle is not None:
        load_binding().abort_collectives(handle, reason)


def check_peer(peer: int, timeout_ms: int) -> None:
    """Returns when the peer's TensorFlow server answers; raises when it does not within
    ``timeout_ms``. The other Python threads (heartbeats) run meanwhile, which TensorFlow's
    own binding of the probe does not let them. Call it from the thread that updates the
    server (the probe uses the server's current executors)."""
    if timeout_ms <= 0:
        raise ValueError(f"timeout_ms={timeout_ms}: a probe needs a bound above 0")
    handle = _context_handle()
    if handle is None:
        raise RuntimeError("TensorFlow's server is not running: no peer can be probed")
    load_binding().check_peer_health(handle, task_device(peer), timeout_ms)


def unreachable_peers(members: Mapping[int, str], node_id: int,
                      timeout_ms: int = 1000) -> list[int]:
    """The members other than `node_id` whose TensorFlow server does not answer a health probe.

    The probes run at once, so a report waits for one timeout, not one per vanished peer.
    """
    peers = [peer for peer in sorted(members) if peer != node_id]

    def unreachable(peer: int) -> bool:
        try:
            check_peer(peer, timeout_ms)
        except Exception:  # noqa: BLE001 - any failure to answer means unreachable
            return True
        return False

    if not peers:
        return []
    with concurrent.futures.ThreadPoolExecutor(len(peers), "tfe-probe") as pool:
        return [peer for peer, lost in zip(peers, pool.map(unreachable, peers)) if lost]


def is_recoverable(error: BaseException) -> bool:
    """Collective failures that a re-form with the surviving members repairs."""
    from tensorflow.python.framework import errors

    return isinstance(error, (errors.UnavailableError, errors.DeadlineExceededError,
                              errors.AbortedError, errors.CancelledError))


def is_mismatch(error: BaseException) -> bool:
    """A collective whose members disagree on what they exchange: in a state sync, a newcomer's
    state that differs in a way its variable layout did not show. TensorFlow reports a shape
    that differs as InvalidArgument, a dtype or an instance that differs as Internal."""
    from tensorflow.python.framework import errors

    return isinstance(error, (errors.InvalidArgumentError, errors.InternalError))


def is_another_groups_mismatch(error: BaseException) -> bool:
    """A mismatch that reached this node while it resolved its group (`CompleteGroup`): a group
    has no shapes to differ on, so it is the abort of a peer that took part in another group's
    failed collective (in a state sync, a member that sent to a differing newcomer before this
    node's turn), not a fault of this node's tensors."""
    return is_mismatch(error) and "WorkerService/CompleteGroup" in str(error)
