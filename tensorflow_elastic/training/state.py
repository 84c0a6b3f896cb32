"""What survives a membership change: committed state, restored on failure, synced to newcomers.

A tiny API in the spirit of Horovod's elastic State: `commit()` at step
boundaries, `restore()` after a failure, `sync()` after every re-form (the state
of the member furthest ahead goes to everyone), and reset callbacks for what depends on the
world size. The strategy orders a traced step's variable writes after all of its collectives
(strategy/ordering.py), so a failed step leaves those variables as the last commit left them:
a commit holds a copy-on-write snapshot only of the variables whose writes it cannot order
(and of the elastic inputs' cursors).
"""

from __future__ import annotations

import copy
import json
import logging
import time
import weakref
from typing import Any, Callable, Iterable, NamedTuple, Protocol

import tensorflow as tf
from tensorflow.python.framework import ops

from tensorflow_elastic.errors import GenerationEnded, NoCommittedState, StateLayoutMismatch
from tensorflow_elastic.observability import events
from tensorflow_elastic.ops.variable_snapshot import VariableSnapshot
from tensorflow_elastic.training import checkpoints, layouts, plain_data

logger = logging.getLogger(__name__)

# Values a commit can keep as they are: copying them would only cost time.
_IMMUTABLE_TYPES = (int, float, bool, str, bytes, type(None))


class Job(Protocol):
    """The few calls a State makes to the job it belongs to (the runtime hands itself in
    through `bind`, as Horovod's State is handed its broadcast)."""

    node_id: int

    def commit(self, state: "State") -> None:
        """The commit protocol: the state's snapshot, the progress, the vote."""

    def exchange(self, topic: str, value: bytes) -> dict[int, bytes]:
        """Every member's `value`, by node id (a small all-gather)."""

    def gathered_at_start(self) -> dict[int, bytes] | None:
        """Every member's sync_message(), gathered as the generation started, once (None: the
        sync exchanges them itself)."""

    def broadcast_variables(self, variables: list, source: int, receivers: list[int],
                            one_group: bool) -> None:
        """The `source`'s values of `variables` to the `receivers`."""

    def prepare_to_sync(self, variables: list) -> None:
        """Builds both sides of broadcast_variables() ahead of time (a joining node receives
        first, and may be the source of a later sync)."""

    def record(self, event: str, **fields: Any) -> None:
        """An event of this node's in the events record."""

    def snapshot_extras(self) -> tuple[Any, list]:
        """(the vote's tally, the elastic inputs' cursors), which every snapshot also holds."""

    def step_order(self) -> Any:
        """The strategy's StepOrder (strategy/ordering.py), or None before there is a strategy."""

    def sync_facts(self) -> dict[str, Any]:
        """What this member tells the others with its state at every sync (plain data)."""

    def take_sync_facts(self, facts: dict[int, dict[str, Any]]) -> None:
        """Every member's sync_facts(), by node id, before any variable moves."""


class _Furthest(NamedTuple):
    """What a sync takes from the member furthest ahead."""

    source: int
    values: dict[str, Any]
    commits: int
    # The members whose variables may differ from the source's (see needing_state()).
    receivers: list[int]
    # Every member's layout digest (b"" for a state without variables; see layouts.check).
    layouts: dict[int, bytes] | None = None


def _copy_values(values: dict[str, Any]) -> dict[str, Any]:
    return {name: value if type(value) in _IMMUTABLE_TYPES else copy.deepcopy(value)
            for name, value in values.items()}


class State:
    """Python attributes (epoch, batch: plain data, see plain_data.py) with commit/restore/sync.

    `snapshot_every` (keyword only, default 1) is the commit policy: every
    commit is a point where the membership may change, but only every
    `snapshot_every`-th one saves a snapshot to roll back to after a failure.
    With 1, a TensorFlowState's commit holds only the variables whose writes the
    strategy cannot order after the step's collectives (see TensorFlowState); a
    larger value holds every variable at every `snapshot_every`-th commit, for
    steps whose writes cannot be ordered: it spares them most of the snapshot's
    cost (a copy of each updated buffer per snapshot) at the price of up to
    `snapshot_every` steps redone after a crash; a join or a leave still loses
    nothing. Measurements: benchmarks/RESULTS.md.
    """

    def __init__(self, *, snapshot_every: int = 1, **values: Any):
        if snapshot_every < 1:
            raise ValueError(f"snapshot_every must be >= 1, got {snapshot_every}")
        object.__setattr__(self, "_values", dict(values))
        object.__setattr__(self, "_committed", _copy_values(values))
        object.__setattr__(self, "_reset_callbacks", [])
        object.__setattr__(self, "_commits", 0)
        object.__setattr__(self, "_saved_commits", 0)
        object.__setattr__(self, "snapshot_every", snapshot_every)
        object.__setattr__(self, "_job", None)
        object.__setattr__(self, "_last_synced", frozenset())
        # Whether the last restore left variables that a failed step may have written (see
        # TensorFlowState.restore): this member then takes the state of one that did not.
        object.__setattr__(self, "_dirty", False)
        # Whether this node came to join a running job and holds none of its state yet (no
        # commit of its own, none synced): it is never a sync's source (see furthest_ahead).
        object.__setattr__(self, "_joining", False)

    def bind(self, job: Job) -> None:
        """Makes this state part of `job` (tensorflow_elastic.run does it)."""
        object.__setattr__(self, "_job", job)

    def _bound(self) -> Job:
        if self._job is None:
            raise RuntimeError("a State commits and syncs inside a function decorated with "
                               "tensorflow_elastic.run")
        return self._job

    def __getattr__(self, name: str) -> Any:
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._values:
            self._values[name] = value
        else:
            object.__setattr__(self, name, value)

    @property
    def commits(self) -> int:
        """How many commits the job has made (a newcomer takes the members' count)."""
        return self._commits

    def uncommitted_steps(self) -> int:
        """Steps done since the last commit, by the `step` or `batch` attribute (0 without one)."""
        for name in ("step", "batch"):
            live, committed = self._values.get(name), self._committed.get(name)
            if isinstance(live, int) and isinstance(committed, int):
                return max(0, live - committed)
        return 0

    @property
    def last_synced(self) -> frozenset[int]:
        """The members the last sync gave another member's state (newcomers, members at
        another commit; every member at the job's start): a fact every member shares."""
        return self._last_synced

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], None]]) -> None:
        """Callbacks run after every re-form, e.g. to rescale the learning rate with the world size."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def save(self) -> None:
        # Plain data or an error now, at the first commit, not at the first recovery.
        plain_data.check(self._values)
        self._committed = _copy_values(self._values)
        self._saved_commits = self._commits

    def restore(self) -> None:
        """Rolls back to the last snapshot (the last commit with `snapshot_every=1`)."""
        self._values.update(_copy_values(self._committed))
        self._commits = self._saved_commits

    def commit(self) -> None:
        """Snapshots the state (every `snapshot_every`-th call), then re-forms here if the
        membership is about to change.

        Every member votes at the same commit, so a growth or a leave happens
        at the same step everywhere and loses no work.
        """
        self._bound().commit(self)

    def count_commit(self, read_tally: Callable[[], tuple[float, ...]]) -> tuple[float, ...]:
        """Counts a commit and saves a snapshot when the policy says; returns the vote's
        tally as of now (`read_tally()`; a state with variables reads it with its snapshot)."""
        self._commits += 1
        if self._commits % self.snapshot_every == 0:
            return self._save_reading_tally(read_tally)
        return read_tally()

    def _save_reading_tally(self, read_tally: Callable[[], tuple[float, ...]]
                            ) -> tuple[float, ...]:
        self.save()
        return read_tally()

    def sync(self) -> None:
        """Makes every member's state that of the member furthest ahead (after every re-form)."""
        self._adopt(self._gather_furthest_ahead())

    def prepare_to_join(self) -> None:
        """Builds, before a node joins, what its first sync runs (the members wait for that)."""
        object.__setattr__(self, "_joining", self._commits == 0)
        self.prepare_syncs()

    def prepare_syncs(self) -> None:
        """Builds, before this process's first sync, what any sync of its state may run (a
        node that receives the state first may send it later: the chief lost), so that no
        recovery waits for it; a State of Python values needs nothing."""

    def sync_message(self) -> bytes:
        """What this member tells the others at a sync: its Python values and commits, its
        job's facts (the members' replica counts travel with the state: one exchange), its
        layout digest, and whether it is dirty or joining."""
        message = {"values": self._values, "commits": self._commits,
                   "job": self._bound().sync_facts()}
        layout = self._layout_digest()
        if layout is not None:
            message["layout"] = layout
        if self._dirty:
            message["dirty"] = True
        if self._joining:
            message["joining"] = True
        return plain_data.encode(message)

    def _layout_digest(self) -> bytes | None:
        """The digest of the state's variables' layout (None: no variables to check)."""
        return None

    def _gather_furthest_ahead(self) -> _Furthest:
        """The id, Python values and commits of the member with the most commits, and every
        member's layout digest.

        After a crash the step in flight may have finished on some members (their
        all-reduce completed) and failed on others: taking the state of one that
        finished it means nobody redoes a finished step. When all members are even
        it is the chief (the lowest id); a newcomer, with no commits, never is.
        Nothing local changes here, so a sync that fails half-way leaves the last
        commit intact.
        """
        job = self._bound()
        blobs = job.gathered_at_start()
        if blobs is None:
            blobs = job.exchange("state", self.sync_message())
        messages = {node_id: plain_data.decode(blob) for node_id, blob in blobs.items()}
        states = {node_id: _state_message(message) for node_id, message in messages.items()}
        job.take_sync_facts({node_id: message["job"] for node_id, message in messages.items()})
        commits = {node_id: told.commits for node_id, told in states.items()}
        dirty = {node_id for node_id, told in states.items() if told.dirty}
        joining = {node_id for node_id, told in states.items() if told.joining}
        source = furthest_ahead(commits, dirty, joining)
        return _Furthest(source, states[source].values, states[source].commits,
                         receivers=needing_state(commits, source, dirty),
                         layouts={node_id: told.layout for node_id, told in states.items()})

    def _adopt(self, furthest: _Furthest) -> None:
        self._values.update(furthest.values)
        # The commit count is the job's global step count.
        self._commits = furthest.commits
        self._last_synced = frozenset(furthest.receivers)
        self._dirty = False
        self._joining = False
        self.save()


class _Told(NamedTuple):
    """What a member told at a sync (see _gather_furthest_ahead)."""

    values: dict[str, Any]
    commits: int
    layout: bytes  # its layout digest, or b""
    dirty: bool
    joining: bool


def _state_message(message: Any) -> _Told:
    """A member's state from the message it exchanged, checked."""
    if (not isinstance(message, dict)
            or set(message) - {"layout", "dirty", "joining"} != {"values", "commits", "job"}
            or not isinstance(message["values"], dict) or type(message["commits"]) is not int
            or message["commits"] < 0 or not isinstance(message.get("layout", b""), bytes)
            or not isinstance(message["job"], dict) or message.get("dirty", True) is not True
            or message.get("joining", True) is not True):
        raise plain_data.NotPlainData("a member's exchanged state is not {values, commits, "
                                      "layout} with its job's facts")
    return _Told(message["values"], message["commits"], message.get("layout", b""),
                 "dirty" in message, "joining" in message)


def furthest_ahead(commits: dict[int, int], dirty: Iterable[int] = (),
                   joining: Iterable[int] = ()) -> int:
    """The node whose state every member takes at a sync: the most commits, the lowest id on
    ties, among the members that hold their commit (not `dirty`, see needing_state).

    A dirty member loses only to a clean one at the same or a later commit. A node `joining`
    a running job with no state of its own (its first sync) never is the source: when every
    member is one, the members that held the job's state finished or were lost, and starting
    the job afresh from a newcomer's values would be a silent restart. When every member at
    the most commits is dirty, nobody holds the job's last commit: taking an older one would
    silently redo committed steps. Both end the job (NoCommittedState).
    """
    joining, dirty = set(joining), set(dirty)
    trained = {node_id: count for node_id, count in commits.items() if node_id not in joining}
    if not trained:
        raise NoCommittedState(
            f"every member ({sorted(commits)}) came to join the running job and none holds its "
            f"state: the members that held it finished or were lost; no member holds the job's "
            f"last commit")
    most = max(trained.values())
    holding = [node_id for node_id, count in trained.items()
               if count == most and node_id not in dirty]
    if not holding:
        raise NoCommittedState(
            f"every member at commit {most} ran steps past it and wrote variables that commit "
            f"does not hold (several step calls between two commits); no member holds the job's "
            f"last commit: commit after every step call (snapshot_every=1 does), or restart "
            f"from a backup")
    return min(holding)


def needing_state(commits: dict[int, int], source: int, dirty: Iterable[int] = ()) -> list[int]:
    """The members whose variables may differ from the `source`'s: every member at another
    commit, every `dirty` member, and at the start (no commit yet) every member.

    Members train in lockstep (every all-reduce gives all of them the same
    values), and a member's variables at a sync are those of its last commit
    (a failed step wrote none of its ordered variables, a restore gives back the
    others, a planned change happens at a commit): the same commit count means
    the same values. A dirty member's failed step wrote variables its commit does
    not hold (it ran several steps between two commits); a newcomer has none, and
    at the start each member's initial values may differ.
    """
    dirty = set(dirty)
    return sorted(node_id for node_id, count in commits.items()
                  if node_id != source and (count != commits[source] or count == 0
                                            or node_id in dirty))


# Horovod's name for the state of plain Python objects.
ObjectState = State


class TensorFlowState(State):
    """Variables plus Python attributes; a commit references buffers, copying nothing.

    With the default commit policy a commit holds (copy-on-write) only the variables that a
    failed step may have written: those whose writes the strategy cannot order after the
    step's collectives (strategy/ordering.py: written inside a loop of steps, or read back
    and reduced later in the step, or in a traced function without collectives, or outside
    traced functions), and the elastic inputs' cursors. The others stay as the last commit
    left them when a step fails, so a restore leaves them alone.
    """

    def __init__(self, variables: Iterable[tf.Variable] = (), **values: Any):
        super().__init__(**values)
        object.__setattr__(self, "_variables", list(variables))
        object.__setattr__(self, "_snapshot", None)
        # The variables the snapshot holds, and where each one's first copy lies in it.
        object.__setattr__(self, "_held", [])
        object.__setattr__(self, "_listened_to", None)  # the step order it listens to
        object.__setattr__(self, "_first_copies", {})
        # Snapshots of variables that became unordered while a step was traced, taken then
        # (before the step ran); merged into the snapshot at the next commit.
        object.__setattr__(self, "_added", [])
        # What the snapshot was built for: (cursors, tally, the step order's version).
        object.__setattr__(self, "_built_for", None)
        # The step order's count of applied steps at the last snapshot (None before the first).
        object.__setattr__(self, "_applied", None)
        # (the variables' ids, their layout, its digest): a variable's name, shape and dtype
        # never change, so every sync after the first reuses them (a sync is a recovery's path).
        object.__setattr__(self, "_described", ((), [], b""))
        # (path, layout, values) of the input cursors in a file read before the state was
        # bound: see read().
        object.__setattr__(self, "_read_from", None)
        self.save()

    def _tracked_variables(self) -> list[tf.Variable]:
        return self._variables

    def _all_variables(self) -> list[tf.Variable]:
        """The state's variables plus the cursors of the strategy's elastic inputs."""
        return self._tracked_variables() + self._snapshot_extras()[1]

    def _snapshot_extras(self) -> tuple[Any, list]:
        return (None, []) if self._job is None else self._job.snapshot_extras()

    def _step_order(self):
        return None if self._job is None else self._job.step_order()

    def _to_hold(self) -> list[tf.Variable]:
        """The variables a snapshot holds: the unordered ones (every one with a commit policy
        of several commits) and the elastic inputs' cursors."""
        order = self._step_order()
        tracked = self._tracked_variables()
        if order is not None and self.snapshot_every == 1:
            tracked = [v for v in tracked if not order.is_ordered(_handles(v))]
        return tracked + self._snapshot_extras()[1]

    def _build(self, tally: tf.Variable | None, built_for: tuple) -> None:
        """A snapshot of every local copy of the held variables (one per replica the worker
        drives), and of the vote's tally: a restore gives every replica the committed values."""
        held = self._to_hold()
        copies = [_local_copies(v) for v in held]
        firsts, position = {}, 0
        for variable, variable_copies in zip(held, copies):
            firsts[id(variable)] = position
            position += len(variable_copies)
        object.__setattr__(self, "_held", held)
        object.__setattr__(self, "_first_copies", firsts)
        object.__setattr__(self, "_snapshot",
                           VariableSnapshot([copy for variable_copies in copies
                                             for copy in variable_copies], reported=tally))
        object.__setattr__(self, "_added", [])
        object.__setattr__(self, "_built_for", built_for)

    def _take(self) -> tuple[float, ...] | None:
        """Takes the snapshot; returns the vote's tally (None before there is a strategy)."""
        tally, cursors = self._snapshot_extras()
        order = self._step_order()
        if order is not None:
            applied = order.read_applied()[0]
            if self._applied is not None:
                order.runs_between(self._applied, applied)
            object.__setattr__(self, "_applied", applied)
        # Rebuilt when an elastic input or the strategy is created after the state, or when
        # the strategy's order of writes changed.
        built_for = (len(cursors), tally, None if order is None else order.version)
        if (self._built_for is None or self._built_for[0] != built_for[0]
                or self._built_for[1] is not tally or self._built_for[2] != built_for[2]):
            self._build(tally, built_for)
        return self._snapshot.take()

    def _held_ids(self) -> set[int]:
        held = {id(v) for v in self._held}
        for variables, _ in self._added:
            held |= {id(v) for v in variables}
        return held

    def _steps_since_snapshot(self) -> bool:
        order = self._step_order()
        return (order is not None and self._applied is not None
                and order.read_applied()[0] != self._applied)

    def _hold_newly_unordered(self) -> None:
        """A variable became unordered while a step is traced: held from now, before the step
        runs (its values are still those of the last commit). When steps ran since the commit
        they are not: a failure then finds this member dirty (see restore())."""
        if self._steps_since_snapshot():
            return
        held = self._held_ids()
        newly = [v for v in self._to_hold() if id(v) not in held]
        if newly:
            snapshot = VariableSnapshot([copy for v in newly for copy in _local_copies(v)])
            snapshot.take()
            self._added.append((newly, snapshot))

    def save(self) -> None:
        State.save(self)
        self._take()

    def _save_reading_tally(self, read_tally: Callable[[], tuple[float, ...]]
                            ) -> tuple[float, ...]:
        State.save(self)
        return self._take()

    def restore(self) -> None:
        """State.restore() plus the held variables, which take their snapshot's buffers (no
        copy, no function to trace or instantiate: a traced assign cost 0.16-0.18 s at the
        first crash of a 100 MB transformer). The others are as the last commit left them,
        unless steps ran since it (several step calls between two commits, the first time
        this member's steps do): the member is then dirty and takes the state from another."""
        super().restore()
        self._snapshot.restore()
        for _, snapshot in self._added:
            snapshot.restore()
        if self._steps_since_snapshot():
            held = self._held_ids()
            if any(id(v) not in held for v in self._all_variables()):
                object.__setattr__(self, "_dirty", True)
            # Several step calls between two commits: every variable is held from now on.
            order = self._step_order()
            order.hold_everything()
            object.__setattr__(self, "_applied", order.read_applied()[0])

    def bind(self, job: Job) -> None:
        super().bind(job)
        order = job.step_order()
        if order is not None and order is not self._listened_to:  # once: bind runs every tfe.run
            order.listen(_weak_call(self._hold_newly_unordered))
            object.__setattr__(self, "_listened_to", order)
        if self._read_from is not None:
            path, layout, values = self._read_from
            object.__setattr__(self, "_read_from", None)
            self._load(path, layout, values, self._snapshot_extras()[1])
            self.save()

    def prepare_syncs(self) -> None:
        variables = self._all_variables()
        if variables:
            self._bound().prepare_to_sync(variables)

    def prepare_to_join(self) -> None:
        super().prepare_to_join()
        # The snapshot the sync's commit takes, built now for the job's tally and inputs: the
        # members would wait for its building in the first step.
        self._take()

    def _layout_digest(self) -> bytes | None:
        variables = self._all_variables()
        return self._layout(variables)[1] if variables else None

    def _layout(self, variables: list[tf.Variable]) -> tuple[list, bytes]:
        """The layout of `variables` and its digest, described once per list of variables."""
        ids = tuple(id(v) for v in variables)
        if self._described[0] != ids:
            layout = layouts.describe(variables)
            object.__setattr__(self, "_described", (ids, layout, layouts.digest(layout)))
        return self._described[1], self._described[2]

    def sync(self) -> None:
        """State.sync() plus the variables, broadcast from the member furthest ahead to the
        members that need them (see needing_state(): none after a crash or a leave of members
        at the same commit, the newcomers after a growth). Before a broadcast, every member's
        state layout is checked against the source's (see layouts.check).

        Records a `state_synced` event (bytes moved, seconds) on the source and the receivers.
        """
        variables = self._all_variables()
        # The layouts' digests travel with the values: one exchange for both.
        furthest = self._gather_furthest_ahead()
        if variables and furthest.receivers:
            job = self._bound()
            layouts.check(job, self._layout(variables)[0], furthest.source, furthest.layouts)
            if job.node_id == furthest.source or job.node_id in furthest.receivers:
                started = time.perf_counter()
                # Before the first commit a differing state is a bug to fix, not a newcomer's
                # fault (see tfe.run): no need to tell the receivers apart.
                job.broadcast_variables(variables, furthest.source, furthest.receivers,
                                        one_group=furthest.commits == 0)
                job.record(events.STATE_SYNCED, source=furthest.source,
                           receivers=furthest.receivers,
                           bytes=sum(tf.TensorShape(v.shape).num_elements()
                                     * tf.as_dtype(v.dtype).size for v in variables),
                           seconds=time.perf_counter() - started)
        self._adopt(furthest)

    def write(self, path: str, keep: int = 1) -> bool:
        """Writes the last commit (variables, Python values, commit count) as a TensorFlow
        checkpoint in the directory `path`, on any filesystem tf.io.gfile reaches: what `read`
        loads when the whole job restarts (see training/checkpoints.py; `keep`: how many
        checkpoints stay).

        Call it on one node (the chief), after a commit (the variables a commit does not
        hold are as it left them until the next step). The Python values must
        be JSON-serializable (epoch, batch, ...). A checkpoint of a later commit is left
        as it is (a member that fell behind must not take the job back): returns
        whether it wrote. The new checkpoint replaces the old one at once.
        """
        held = self._snapshot.saved_values()
        variables = self._all_variables()
        arrays = [held[self._first_copies[id(v)]].numpy() if id(v) in self._first_copies
                  else _local_copies(v)[0].numpy() for v in variables]
        saved = checkpoints.Saved(layouts.describe(variables), self._committed,
                                  self._saved_commits, arrays)
        if not checkpoints.write(path, saved, keep):
            logger.warning("%s holds a later commit than %d; left as it is", path,
                           self._saved_commits)
            return False
        return True

    def read(self, path: str) -> bool:
        """Loads what `write` wrote to `path`, if it exists; returns whether it did.

        Call it before training starts (before `tensorflow_elastic.run`): the
        job then resumes from that commit, and a node that found no file takes
        the state from one that did at the first sync. The cursors of the
        strategy's elastic inputs, which come last, load when
        `tensorflow_elastic.run` binds the state to the job that holds them.
        """
        saved = checkpoints.read(path)
        if saved is None:
            return False
        variables = self._all_variables()
        loadable = len(variables) if self._job is None else len(saved.layout)
        self._load(path, saved.layout[:loadable], saved.arrays[:loadable], variables)
        object.__setattr__(self, "_read_from", (path, saved.layout[loadable:],
                                                saved.arrays[loadable:]))
        self._values.update(saved.values)
        self._commits = saved.commits
        self.save()
        return True

    def _load(self, path: str, layout: list, values: list, variables: list) -> None:
        """Gives `variables` the `values` read from `path` when their layouts agree."""
        mine = json.loads(json.dumps(layouts.describe(variables)))
        if layout != mine:
            raise StateLayoutMismatch(
                f"the state saved in {path} differs from this node's "
                f"{layouts.first_difference(mine, layout, 'the file has')}: build the model, optimizer "
                f"and inputs as the job that wrote it did, or start from another file")
        for variable, value in zip(variables, values):
            for copy in _local_copies(variable):
                copy.assign(value)


class KerasState(TensorFlowState):
    """A Keras model and optimizer plus Python attributes (epoch, batch, ...)."""

    def __init__(self, model, optimizer=None, **values: Any):
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_optimizer", optimizer)
        if optimizer is not None and not _optimizer_built(optimizer):
            # Slots must exist on every member before the first sync; in the scope of the
            # strategy the model was built in.
            with model.distribute_strategy.scope():
                optimizer.build(model.trainable_variables)
        super().__init__(variables=(), **values)

    def on_reset(self) -> None:
        # Keras' evaluation and prediction functions bake in the world size; dropped at every
        # re-form, they are rebuilt when next used (the elastic callback retraces training).
        self._model.test_function = None
        self._model.predict_function = None
        super().on_reset()

    def _tracked_variables(self) -> list[tf.Variable]:
        variables = list(self._model.variables)
        if self._optimizer is not None:
            variables += list(self._optimizer.variables)
        return variables


def _optimizer_built(optimizer) -> bool:
    """Whether the optimizer has its slots: Keras 3 says `built`, tf-keras `_built` (set only
    once built); an optimizer without `build` builds its slots itself."""
    if not callable(getattr(optimizer, "build", None)):
        return True
    return bool(getattr(optimizer, "built", getattr(optimizer, "_built", False)))


def _handles(variable) -> list[int]:
    """The ids of the resource handles of a variable's local copies (what ordering.py names)."""
    return [ops.tensor_id(copy.handle) for copy in _local_copies(variable)]


def _weak_call(method) -> Callable[[], None]:
    """Calls `method` while its object lives (a listener that does not keep a state alive)."""
    reference = weakref.WeakMethod(method)

    def call() -> None:
        bound = reference()
        if bound is not None:
            bound()

    return call


def _local_copies(variable) -> list:
    """The plain variables behind a Keras or mirrored variable, one per local replica: reading
    them is 3x cheaper."""
    inner = getattr(variable, "_value", None)
    if isinstance(inner, tf.Variable):
        variable = inner
    if isinstance(variable, tf.distribute.DistributedValues):
        return list(variable.values)
    return [variable]

