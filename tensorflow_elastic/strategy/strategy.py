"""ElasticMultiWorkerMirroredStrategy: MultiWorkerMirroredStrategy whose membership changes in-process.

The strategy/extended split follows tf.distribute: the strategy is the user
API, `ElasticExtended` holds the cluster. A re-form (`ElasticExtended.regroup`)
updates the running server, the collective group and the world size in place:
no process restarts, variables stay, traced functions keep working because
their collectives read group size and key from variables (collectives.py).
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from tensorflow.python.distribute import collective_all_reduce_strategy as mwms_lib
from tensorflow.python.distribute import collective_util, distribute_lib
from tensorflow.python.distribute import mirrored_strategy, numpy_dataset, reduce_util
from tensorflow.python.distribute import values as values_lib
from tensorflow.python.distribute.cluster_resolver import SimpleClusterResolver
from tensorflow.python.eager import context
from tensorflow.python.framework import dtypes, ops
from tensorflow.python.ops import variables
from tensorflow.python.training import server_lib
from tensorflow.python.util import nest

from tensorflow_elastic.data.replicas import InputSlices
from tensorflow_elastic.strategy import cluster, collectives, ordering, runtime
from tensorflow_elastic.strategy import devices as devices_lib
from tensorflow_elastic.strategy.agreement import ReformVote
from tensorflow_elastic.tf_internals import private, require

# The private methods of TensorFlow's multi-worker strategy that ElasticExtended overrides or
# calls: a release that renamed one would leave an override silently unused.
require(mwms_lib.CollectiveAllReduceExtended, "_initialize_strategy", "_num_replicas_in_sync",
        "_get_variable_creator_initial_value", "_reduce_to", "_get_cross_device_ops",
        "_in_multi_worker_mode", "_start_check_health_thread")
_initialize_single_worker = private(mirrored_strategy.MirroredExtended, "_initialize_single_worker")
_mirrored_initial_value = private(mirrored_strategy.MirroredExtended,
                                  "_get_variable_creator_initial_value")



class ElasticExtended(mwms_lib.CollectiveAllReduceExtended):
    """The cluster side: a sparse cluster of permanent ids that can be regrouped.

    Each worker drives its local devices, one replica each (devices.py); workers
    may drive different numbers of them. The job's replicas are counted from every
    member's count, which members tell each other at every sync (take_replica_counts).
    """

    def __init__(self, container_strategy, node_id: int, members: Mapping[int, str],
                 generation: int, communication_options: collective_util.Options,
                 wants_reform: Callable[[], bool], local_devices: Sequence[str] | None = None):
        self._node_id = node_id
        self._requested_devices = None if local_devices is None else list(local_devices)
        self._wants_reform = wants_reform
        self._initial_members = dict(members)
        self._generation = generation
        super().__init__(container_strategy,
                         cluster_resolver=SimpleClusterResolver(server_lib.ClusterSpec({})),
                         communication_options=communication_options)

    def _initialize_strategy(self, cluster_resolver, devices):
        node_id, members = self._node_id, self._initial_members
        self._task_type, self._task_id = cluster.JOB_NAME, node_id
        self._rpc_layer = "grpc"
        self._worker_device = f"/job:{cluster.JOB_NAME}/task:{node_id}"
        self._host_input_device = numpy_dataset.SingleDevice(self._worker_device)
        cluster.start(members, node_id)
        self._collective_ops_configured = True
        self._std_server_started = True
        del devices  # the cluster resolver's: this worker's come from the constructor
        local_devices, self._local_device_type = devices_lib.local_devices(
            self._worker_device, self._requested_devices, context.num_gpus())
        self._num_devices_per_worker = len(local_devices)
        # Each member's replica count, as last exchanged (a member not in it yet is
        # taken to drive as many as this one until the next exchange).
        self._replica_counts: dict[int, int] = {}
        self._num_replicas = len(local_devices) * len(members)
        self.vote = ReformVote(self._worker_device, self._wants_reform)
        self.step_order = ordering.StepOrder(self._worker_device)
        ordering.use(self.step_order)
        self._collective_keys = collectives.collective_keys_for(self._generation)
        world = len(members)
        self._cross_device_ops = collectives.ElasticCollectiveAllReduce(
            local_devices, len(local_devices) * world, self._communication_options,
            self._collective_keys, collectives.STEP_GROUP, self._generation, vote=self.vote)
        self._host_cross_device_ops = collectives.ElasticCollectiveAllReduce(
            [self._worker_device], world, self._communication_options, self._collective_keys,
            collectives.HOST_GROUP, self._generation, vote=self.vote)
        self._broadcaster = collectives.VariableBroadcaster(f"{self._worker_device}/device:CPU:0")
        _initialize_single_worker(self, local_devices)
        self._default_device = self._worker_device
        # Plain CPU variables the elastic input reads at every batch (not mirrored:
        # each worker has its own rank).
        with ops.init_scope(), ops.device("/cpu:0"):
            self.world_size_variable = variables.Variable(1, dtype=dtypes.int64, trainable=False,
                                                          name="elastic_world_size")
            self.rank_variable = variables.Variable(0, dtype=dtypes.int64, trainable=False,
                                                    name="elastic_rank")
            # The job's replicas and the index of this worker's first one (the elastic input
            # cuts the global batch among replicas).
            self.replicas_variable = variables.Variable(1, dtype=dtypes.int64, trainable=False,
                                                        name="elastic_replicas")
            self.first_replica_variable = variables.Variable(
                0, dtype=dtypes.int64, trainable=False, name="elastic_first_replica")
        self.input_cursors: list = []
        # The input most recently distributed for Keras (its training input at on_train_begin).
        self.latest_input = None
        self._set_members(members, self._generation)

    def _set_members(self, members: Mapping[int, str], generation: int) -> None:
        ordered = sorted(members)
        self._members = dict(members)
        self._generation = generation
        self._num_workers = len(ordered)
        self._is_chief = self._node_id == ordered[0]
        self._id_in_cluster = ordered.index(self._node_id)
        self._cluster_spec = server_lib.ClusterSpec({cluster.JOB_NAME: dict(members)})
        self.vote.regroup(generation, len(ordered))
        self.world_size_variable.assign(len(ordered))
        self.rank_variable.assign(self._id_in_cluster)
        own = self._num_devices_per_worker
        self._use_replica_counts({member: self._replica_counts.get(member, own)
                                  for member in ordered})

    def _use_replica_counts(self, counts: Mapping[int, int]) -> None:
        """Sizes the step's group and the elastic input's cut by every member's replica count."""
        self._replica_counts = dict(counts)
        self._num_replicas, first = devices_lib.replica_layout(counts, self._node_id)
        self._cross_device_ops.regroup(self._num_replicas, self._collective_keys,
                                       self._generation)
        self.replicas_variable.assign(self._num_replicas)
        self.first_replica_variable.assign(first)

    @property
    def local_replica_count(self) -> int:
        """How many replicas this worker drives (one per local device)."""
        return self._num_devices_per_worker

    def take_replica_counts(self, told: Mapping[int, object]) -> None:
        """Every member's replica count as it told it at the sync (every member's
        local_replica_count); before the generation's first collective, whose group size is
        the job's replica count."""
        counts = {}
        for node, count in told.items():
            if type(count) is not int or count < 1:
                raise ValueError(f"member {node} says it drives {count!r} replicas")
            counts[node] = count
        if set(counts) != set(self._members):
            raise ValueError(f"replica counts came from {sorted(counts)}, not from the "
                             f"members {sorted(self._members)}")
        if counts != self._replica_counts:
            self._use_replica_counts(counts)

    @property
    def _num_replicas_in_sync(self):
        return self._num_replicas

    def regroup(self, members: Mapping[int, str], generation: int) -> None:
        """Moves this process to generation `generation` with `members`; all members call it."""
        if generation <= self._generation:
            raise ValueError(f"generation {generation} is not newer than {self._generation}")
        cluster.update(members, self._node_id)
        self._collective_keys = collectives.collective_keys_for(generation)
        self._set_members(members, generation)
        self._host_cross_device_ops.regroup(len(members), self._collective_keys, generation)

    def broadcast_variables(self, variables: list, source: int, receivers: list[int], *,
                            one_group: bool = False) -> None:
        """Gives the `receivers`' `variables` the `source` member's values; the source and the
        receivers call it. Members which hold the state already neither receive it nor wait
        for it, and each receiver takes it in a group of its own with the source (see
        VariableBroadcaster.broadcast_in_pairs). `one_group`: when every other member
        receives, they all do in the step's group instead, which the first step then finds
        resolved; for the job's start, where no newcomer can be at fault. In a world of two
        the one pair is the step's group anyway."""
        if len(receivers) == self._num_workers - 1 and (one_group or len(receivers) == 1):
            # The step's group when every member drives one CPU replica (one group to resolve
            # per generation), otherwise the host group.
            shared = (self._cross_device_ops
                      if self._num_replicas == self._num_workers and self._local_device_type == "CPU"
                      else self._host_cross_device_ops)
            self._broadcaster.broadcast(variables, self._node_id == source,
                                        shared.runtime_group_size.value,
                                        shared.runtime_group_key.value)
        else:
            self._broadcaster.broadcast_in_pairs(variables, self._node_id, source, receivers,
                                                 self._generation)

    def prepare_to_sync(self, variables: list) -> None:
        """Traces both sides of broadcast_variables() ahead of time (a joining node: it
        receives first, and may be the source of a later sync)."""
        self._broadcaster.prepare(variables, is_source=False)
        self._broadcaster.prepare(variables, is_source=True)

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def members(self) -> dict[int, str]:
        return dict(self._members)

    @property
    def node_id(self) -> int:
        return self._node_id

    def _get_variable_creator_initial_value(self, replica_id, device, primary_var, **kwargs):
        # No broadcast at creation: a newcomer creates its variables while the
        # others train, and State.sync() makes all members equal afterwards.
        return _mirrored_initial_value(
            self, replica_id=replica_id, device=device, primary_var=primary_var, **kwargs)

    def _reduce_to(self, reduce_op, value, destinations, options):
        if self._num_workers > 1 or (isinstance(value, values_lib.Mirrored)
                                     and reduce_op == reduce_util.ReduceOp.MEAN):
            return super()._reduce_to(reduce_op, value, destinations, options)
        # At world size 1 the stock code reduces locally; a function traced
        # now would then never reduce again once the world has grown.
        if isinstance(value, values_lib.DistributedValues) and len(self.worker_devices) == 1:
            value = value.values[0]
        return self._get_cross_device_ops(value).reduce(
            reduce_op, value, destinations=destinations,
            options=self._communication_options.merge(options))

    def _in_multi_worker_mode(self):
        return True

    def _start_check_health_thread(self):
        # Peer health is the orchestrator's job (heartbeats, watch, reports).
        return None


class ElasticMultiWorkerMirroredStrategy(mwms_lib.CollectiveAllReduceStrategy):
    """Synchronous data-parallel training whose workers can fail, leave and join.

    Create it after `tensorflow_elastic.init()` (it calls `init()` itself when
    needed). `num_replicas_in_sync` follows the current world size; use a
    constant global batch (`distribute_elastic_dataset`) and
    `tf.nn.compute_average_loss(..., global_batch_size=...)` so that nothing
    traced depends on the world size.
    """

    def __init__(self, min_nodes: int | None = None, max_nodes: int | None = None,
                 communication_options: collective_util.Options | None = None,
                 devices: Sequence[str] | None = None):
        if communication_options is None:
            # No per-collective timeout: it costs about 10% of a 10 ms step
            # (measured with 3 local workers). A lost peer is detected by the
            # orchestrator, and the runtime's progress watchdog bounds the rest.
            communication_options = collective_util.Options()
        elastic = runtime.ensure_initialized(min_nodes=min_nodes, max_nodes=max_nodes)
        node_id, members, generation = elastic.session.initial_cluster()
        elastic.release_address()  # the server below binds it at once
        extended = ElasticExtended(self, node_id, members, generation, communication_options,
                                   elastic.session.wants_reform, devices)
        distribute_lib.Strategy.__init__(self, extended)
        self._elastic_runtime = elastic
        elastic.attach_strategy(self)

    def reduce(self, reduce_op, value, axis):
        """`Strategy.reduce` that also takes nested structures and scalars with an axis.

        Keras 3's TensorFlow trainer reduces a whole (x, y) batch in one call
        and its scalar logs with `axis=0`; the stock strategy rejects both
        ("Attempt to convert a value (PerReplica...)"), so `model.fit` fails
        under MultiWorkerMirroredStrategy. Each leaf is reduced on its own, and
        a scalar has no axis to reduce along.

        An input batch cut among a worker's replicas (the elastic input's, with
        several local devices) reduces to its first slice, with no collective:
        Keras 3 reduces one batch only to learn its structure before it builds
        the model, and a collective there would wait for the workers with one
        replica, whose batches are plain tensors that Keras does not reduce.
        """
        parent = super()

        def reduce_leaf(leaf):
            if isinstance(leaf, InputSlices):
                return leaf.values[0]
            leaf_axis = axis
            if leaf_axis is not None:
                local = self.experimental_local_results(leaf)[0]
                if getattr(local, "shape", None) is not None and local.shape.rank == 0:
                    leaf_axis = None
            return parent.reduce(reduce_op, leaf, leaf_axis)

        return nest.map_structure(reduce_leaf, value)

    def distribute_elastic_dataset(self, dataset, global_batch_size: int,
                                   drop_remainder: bool = False):
        """This worker's slice of every global batch of `dataset`, following the membership.

        The global batch size stays `global_batch_size` whatever the world
        size; the input's cursor is part of every State (committed, restored,
        synced to newcomers), so no sample is lost or seen twice across
        re-forms. Iterate it directly and pass its batches to `run`; do not
        wrap it in `experimental_distribute_dataset` (its prefetch would read
        ahead of the cursor). See docs/elastic_input.md.
        """
        from tensorflow_elastic.data import elastic_dataset

        extended = self.extended
        distributed = elastic_dataset(dataset, global_batch_size, extended.replicas_variable,
                                      extended.first_replica_variable,
                                      drop_remainder=drop_remainder,
                                      replica_devices=extended.worker_devices)
        extended.input_cursors.append(distributed.cursor)
        return distributed

    def experimental_distribute_dataset(self, dataset, options=None):
        """This worker's slices of the global batches of `dataset`, which ends with `.batch(G)`.

        Keras `fit`, `evaluate` and `predict` call this. The examples before the
        last batch are cut into global batches of G through the elastic input,
        so the global batch stays G whatever the world size, and each new
        iterator starts at the input's position (`seek`), which the elastic
        Keras callback keeps at the committed batch: a `fit` called again after
        a re-form continues the interrupted pass. Elements are this worker's
        slice (plain tensors with one local replica; PerReplica values, one slice per device,
        with several).
        """
        from tensorflow_elastic.data.batched import distribute_batched

        del options  # Prefetching to devices would read ahead of the cursor.
        extended = self.extended
        distributed = distribute_batched(dataset, extended.replicas_variable,
                                         extended.first_replica_variable,
                                         replica_devices=extended.worker_devices)
        extended.latest_input = distributed
        return distributed

    def distribute_datasets_from_function(self, dataset_fn, options=None):
        """`dataset_fn` called once for one input pipeline; its batches are the global batches.

        The elastic input shards at run time, so the function must not shard
        (the context says one pipeline) and batches by the global batch size.
        """
        context = distribute_lib.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                              num_replicas_in_sync=1)
        return self.experimental_distribute_dataset(dataset_fn(context), options)

    @property
    def generation(self) -> int:
        return self.extended.generation

    @property
    def node_id(self) -> int:
        return self.extended.node_id
