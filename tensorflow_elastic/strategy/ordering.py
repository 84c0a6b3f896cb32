"""A step's variable updates ordered after all of the step's collectives: a failed step changes no
variable, so a commit needs no copy of the state.

A step's collectives fail when a peer is lost; everything else in a step is local. When every
write of a variable in a traced step waits for every collective of that step, a step whose
collectives failed has written nothing, and a step whose collectives all completed writes
everything: a member's variables are then those of its last commit, or (its step finished)
those of the next, which it commits. The strategy's launchers register every collective they
create in a traced function (`StepOrder.collective_created`); when TensorFlow's automatic
control dependencies finish that function (their resolver hook, called for every op once the
function is traced), `plan()` picks the variable writes of the function that can wait for
every collective without forming a cycle, and each of them waits for one op that waits for
every collective (the run counter below: collectives + writes edges, not their product). A write that cannot wait (a later
collective depends on it: an update inside a loop of steps, a value read back and reduced
later in the step) leaves its variables unordered, as do writes in traced functions without
collectives and collectives run eagerly (every variable then). The state keeps a copy-on-write
snapshot of the unordered variables only.

Each traced step also counts its runs in `applied` (a host variable, ordered like a write and
before the writes): a member whose count moved since its last commit when a step fails has
written a step its commit does not count (a commit interval of several step calls), so it
takes the state from a member that has not.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Callable, Hashable, Iterable

import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.framework import auto_control_deps, auto_control_deps_utils, ops
from tensorflow.python.ops import gen_resource_variable_ops

from tensorflow_elastic.ops.variable_snapshot import Float64Reader
from tensorflow_elastic.tf_internals import require

require(ops.Operation, "_add_control_inputs", "_add_control_input")

# Ops that run functions of their own: a function of a step that has collectives inside runs
# them through one of these.
_CALL_OPS = frozenset({"If", "StatelessIf", "While", "StatelessWhile", "Case", "StatelessCase",
                       "PartitionedCall", "StatefulPartitionedCall"})


@dataclasses.dataclass(frozen=True)
class OpNode:
    """What plan() needs of an op: the ops it waits for, and the resources it reads and writes."""

    key: Hashable
    inputs: tuple[Hashable, ...]
    reads: frozenset = frozenset()
    writes: frozenset = frozenset()
    stateful: bool = False


@dataclasses.dataclass
class Plan:
    """The writes that can wait for every collective of the function, and those that cannot."""

    ordered: list[Hashable]
    unordered: list[Hashable]


def _automatic_edges(nodes: list[OpNode]) -> dict[Hashable, list[Hashable]]:
    """The edges TensorFlow's automatic control dependencies add once the function is traced
    (uses of one resource in program order, reads before the next write; stateful ops without
    resources in program order): plan() must not make a write wait for an op that will wait
    for it."""
    edges: dict[Hashable, list[Hashable]] = {}
    last_write: dict[Hashable, Hashable] = {}
    reads_since: dict[Hashable, list[Hashable]] = {}
    last_stateful = None
    for node in nodes:
        before = edges.setdefault(node.key, [])
        for resource in node.reads | node.writes:
            if resource in last_write:
                before.append(last_write[resource])
            if resource in node.writes:
                before.extend(reads_since.pop(resource, []))
                last_write[resource] = node.key
            else:
                reads_since.setdefault(resource, []).append(node.key)
        if node.stateful and not (node.reads or node.writes):
            if last_stateful is not None:
                before.append(last_stateful)
            last_stateful = node.key
    return edges


def _ancestors(starts: Iterable[Hashable], inputs: dict[Hashable, Iterable[Hashable]]
               ) -> set[Hashable]:
    """Every op that one of `starts` waits for (one walk for all of them: a step has hundreds
    of collectives and tens of thousands of ops)."""
    seen: set[Hashable] = set()
    stack = list(starts)
    while stack:
        for parent in inputs.get(stack.pop(), ()):
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return seen


def plan(nodes: list[OpNode], collectives: Iterable[Hashable]) -> Plan:
    """Which writes of a traced function (`nodes`, in program order) can wait for all of its
    `collectives`. A write that some collective depends on (also through the automatic edges
    still to come) cannot: waiting would be a cycle."""
    collectives = list(collectives)
    automatic = _automatic_edges(nodes)
    inputs = {node.key: list(node.inputs) + automatic[node.key] for node in nodes}
    upstream = _ancestors(collectives, inputs)
    waiting = set(collectives)
    ordered, unordered = [], []
    for node in nodes:
        if not node.writes or node.key in waiting:
            continue
        (unordered if node.key in upstream else ordered).append(node.key)
    return Plan(ordered, unordered)


def _resource_key(tensor) -> int:
    while tensor.op.type == "Identity":
        tensor = tensor.op.inputs[0]
    return ops.tensor_id(tensor)


def _node(op) -> OpNode:
    reads, writes = auto_control_deps_utils.get_read_write_resource_inputs(op)
    writes = frozenset(_resource_key(t) for t in writes)
    return OpNode(op, tuple(t.op for t in op.inputs) + tuple(op.control_inputs),
                  frozenset(_resource_key(t) for t in reads) - writes, writes,
                  auto_control_deps.op_is_stateful(op))


class _Handles:
    """The ids of the eager resource handles (the variables' own) that ops write, followed
    through the captures of enclosing functions."""

    def __init__(self):
        self._captured: dict = {}

    def written(self, ops_: Iterable) -> set[int]:
        handles = set()
        for op in ops_:
            for tensor in auto_control_deps_utils.get_read_write_resource_inputs(op)[1]:
                handle = self._outer(op.graph, tensor)
                if handle is not None:
                    handles.add(handle)
        return handles

    def _outer(self, graph, tensor) -> int | None:
        while True:
            while tensor.op.type == "Identity":
                tensor = tensor.op.inputs[0]
            if graph not in self._captured:
                self._captured[graph] = {ops.tensor_id(internal): external
                                         for external, internal in graph.captures}
            external = self._captured[graph].get(ops.tensor_id(tensor))
            if external is None:
                return None
            if isinstance(external, ops.EagerTensor):
                return ops.tensor_id(external)
            graph, tensor = external.graph, external


def _is_nested(graph) -> bool:
    outer = getattr(graph, "outer_graph", None)
    return outer is not None and getattr(outer, "building_function", False)


class StepOrder:
    """Orders the writes of every traced step after its collectives, and says which variables
    a failed step may still have written (`is_ordered`)."""

    def __init__(self, device: str):
        with tf.init_scope(), tf.device(f"{device}/device:CPU:0"):
            # How many runs of traced steps got past all their collectives (float64 in host
            # memory: read without an eager op).
            self.applied = tf.Variable([0.0], dtype=tf.float64, trainable=False,
                                       name="elastic_steps_applied")
        self.read_applied = Float64Reader(self.applied)
        self._device = device
        # Per traced function: the collectives created in it, and the run counter's variable.
        self._applied_in: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._collectives: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        # Functions that hold collectives only inside functions they call.
        self._calling: "weakref.WeakSet" = weakref.WeakSet()
        self._exempt: "weakref.WeakSet" = weakref.WeakSet()
        self._done: "weakref.WeakSet" = weakref.WeakSet()
        self._ordered: set[int] = set()
        self._unordered: set[int] = set()
        # Every variable is unordered: a collective ran eagerly, or a commit interval held
        # several runs of steps.
        self.all_unordered = False
        self.version = 0
        self._listeners: list[Callable[[], None]] = []

    # -------------------------------------------------------------- what the state asks

    def is_ordered(self, handles: Iterable[int]) -> bool:
        """Whether a failed step leaves the variable with these handles (its local copies') as
        its last commit left it: every traced step that writes it writes it after all its
        collectives."""
        handles = list(handles)
        return (not self.all_unordered and all(h in self._ordered for h in handles)
                and not any(h in self._unordered for h in handles))

    def listen(self, callback: Callable[[], None]) -> None:
        """`callback()` runs when a variable becomes unordered while a step is traced, before
        the step runs (the state then holds it from now on)."""
        self._listeners.append(callback)

    def runs_between(self, before: float, now: float) -> None:
        """At a commit: `now - before` runs of steps since the last commit; more than one (a
        commit interval of several step calls) makes every variable unordered from now on."""
        if now - before > 1 and not self.all_unordered:
            self.all_unordered = True
            self.version += 1

    # ----------------------------------------------------------- what the strategy tells

    def collective_created(self, output) -> None:
        """A launcher created a collective (its output `output`)."""
        # (A launcher may run in a thread of its own, where eager execution is on while the
        # function is traced: the output tells.)
        if isinstance(output, ops.EagerTensor):
            self.hold_everything()
            return
        graph = output.graph
        if graph in self._exempt:
            return
        if graph not in self._collectives:
            self._collectives[graph] = []
            outer = graph
            while _is_nested(outer):
                outer = outer.outer_graph
                self._calling.add(outer)
            if outer is graph:
                # The run counter's variable, captured while the function is traced (a capture
                # once it is traced would not be an input of the function).
                self._applied_in[graph] = graph.capture(self.applied.handle)
        self._collectives[graph].append(output.op)

    def exempt_current_graph(self) -> None:
        """The function being traced writes variables outside any step (the state sync)."""
        if not context.executing_eagerly():
            self._exempt.add(ops.get_default_graph())

    def function_traced(self, graph) -> None:
        """Orders the writes of the traced function `graph` (once): TensorFlow calls it from
        its automatic control dependencies, before the function first runs."""
        if graph in self._done or graph in self._exempt:
            return
        self._done.add(graph)
        handles = _Handles()
        collectives = list(self._collectives.get(graph, ()))
        nested = _is_nested(graph)
        operations = graph.get_operations()
        calls = [op for op in operations if op.type in _CALL_OPS] if graph in self._calling else []
        if nested or not collectives:
            # A function run inside a step's own function is ordered there (as one op) unless
            # it holds collectives; a function of its own without collectives may write
            # between two steps' collectives.
            if collectives or calls or not nested:
                self._add(set(), handles.written(operations))
            return
        decided = plan([_node(op) for op in operations], collectives + calls)
        if decided.ordered:
            self._count_runs(graph, collectives + calls, decided.ordered)
        # A call treated as a collective is not ordered, whatever it writes.
        self._add(handles.written(decided.ordered),
                  handles.written(decided.unordered + calls))

    def _count_runs(self, graph, collectives: list, writes: list) -> None:
        """Adds to `graph` the count of its runs in `applied`: after its collectives, before
        its ordered writes, which it orders after the collectives (and which keep it from
        being pruned)."""
        with graph.as_default(), tf.device(f"{self._device}/device:CPU:0"):
            counter = gen_resource_variable_ops.assign_add_variable_op(
                self._applied_in[graph], tf.constant([1.0], tf.float64))
        counter._add_control_inputs(collectives)  # noqa: SLF001
        for write in writes:
            write._add_control_input(counter)  # noqa: SLF001

    def _add(self, ordered: set[int], unordered: set[int]) -> None:
        newly_unordered = (unordered - self._unordered) & self._ordered
        if ordered - self._ordered or unordered - self._unordered:
            self._ordered |= ordered
            self._unordered |= unordered
            self.version += 1
        if newly_unordered:
            self._tell()

    def hold_everything(self) -> None:
        """Every variable is unordered from now on (a collective ran eagerly, a failed step
        found steps run since the last commit)."""
        if not self.all_unordered:
            self.all_unordered = True
            self.version += 1
            self._tell()

    def _tell(self) -> None:
        for callback in self._listeners:
            callback()


# The process's one elastic strategy's StepOrder (a process has at most one strategy).
_current: "list[StepOrder]" = []


def use(order: StepOrder) -> None:
    """Makes `order` the one that TensorFlow's traced functions report to."""
    _current[:] = [order]


def collective_created(output) -> None:
    """See StepOrder.collective_created (a no-op before there is a strategy)."""
    if _current:
        _current[0].collective_created(output)


def exempt_current_graph() -> None:
    """See StepOrder.exempt_current_graph (a no-op before there is a strategy)."""
    if _current:
        _current[0].exempt_current_graph()


_last_graph: "list[weakref.ref]" = []


@auto_control_deps.register_acd_resource_resolver
def _function_traced(op, reads, writes) -> bool:
    """Called by TensorFlow for every op of a function once it is traced; acts once per
    function, and changes no resource."""
    del reads, writes
    graph = op.graph
    if _current and not (_last_graph and _last_graph[0]() is graph):
        _last_graph[:] = [weakref.ref(graph)]
        _current[0].function_traced(graph)
    return False
