"""Keras `model.fit` under the elastic strategy: epoch/batch state, commits, resume mid-epoch.

Works with Keras 3 (the default `tf.keras` of TensorFlow 2.21) and with the
legacy tf-keras (TF_USE_LEGACY_KERAS=1): both reach it through `tf.keras`.

The input's position is the committed `state.batch` (and `state.epoch` for an
endless input): the strategy's `experimental_distribute_dataset`, which Keras
calls, cuts the user's global batches elastically, and the callback starts
every epoch's iterator at that position, so a `fit` called again after a
re-form continues the interrupted pass: no example repeats or goes missing.
Under Keras 3 a `fit` call goes on after a recovery (fit_retry.py): a batch whose
generation ended runs again, a node joins or leaves at a commit, inside the same
call, while a newcomer begins its own; `fit` is entered again when that is not
safe (tf-keras, members at different commits, commits or snapshots not at every
batch).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import weakref
from typing import Any, Callable, Iterable

import tensorflow as tf
from tensorflow.python.distribute import values as values_lib

from tensorflow_elastic.data.batched import global_batches_per_pass
from tensorflow_elastic.strategy import runtime as runtime_lib
from tensorflow_elastic.strategy.strategy import ElasticExtended
from tensorflow_elastic.tf_internals import private, require
from tensorflow_elastic.training import fit_retry
from tensorflow_elastic.training import warm_up as warm_up_lib
from tensorflow_elastic.training.state import State
# tfe.keras.MembershipSummaries
from tensorflow_elastic.training.summaries import MembershipSummaries  # noqa: F401

logger = logging.getLogger(__name__)

# What `make_*_function` sets (tf-keras also keeps the tf.function behind its train function).
_FUNCTIONS = ("train_function", "train_tf_function", "test_function", "predict_function")


@dataclasses.dataclass
class _Traced:
    """A model's traced functions for each world size it has trained at. Keras bakes
    `num_replicas_in_sync` into the loss scaling of its traced functions, so a world size
    change needs functions traced for the new size: traced once per size, then reused (a
    traced function serves every generation of its world size)."""

    world: int
    functions: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)


_traced: "weakref.WeakKeyDictionary[Any, _Traced]" = weakref.WeakKeyDictionary()


class _EpochOver:
    """What `stop_training` holds when the callback ends an epoch Keras cannot count: true, so
    fit leaves the epoch, and not `True`, so a callback that stops the training (EarlyStopping,
    TerminateOnNaN) replaces it and is not undone at the epoch's end."""

    def __bool__(self) -> bool:
        return True


_EPOCH_OVER = _EpochOver()


class ElasticCallback(tf.keras.callbacks.Callback):
    """Resumes `fit` where `state` says training is, keeps `state.epoch` and `state.batch`
    current, commits every `commit_every` batches, and starts the training input of every
    epoch at the committed batch.

    A plain `model.fit(dataset, epochs=...)` inside `@tfe.run` with this
    callback continues after a re-form from the committed (epoch, batch), as
    `fit_elastic` does. A commit is also where a membership change (a node
    joining or leaving) takes effect, so `commit_every` bounds both the work a
    crash can lose and how long a newcomer waits. `steps_per_epoch` is the
    length of a whole epoch (default: the `fit` call's steps). With `backup`
    (a file path), the chief writes the state there at every epoch's end
    (`TensorFlowState.write`): a job restarted as a whole resumes from it
    with `state.read(backup)` before training.
    """

    def __init__(self, state: State, commit_every: int = 1, steps_per_epoch: int | None = None,
                 backup: str | None = None):
        super().__init__()
        if commit_every < 1:
            raise ValueError(f"commit_every must be >= 1, got {commit_every}")
        if backup is not None and not callable(getattr(state, "write", None)):
            raise TypeError(f"a backup needs a state with variables (KerasState), got "
                            f"{type(state).__name__}")
        self.state = state
        self.commit_every = commit_every
        self.steps_per_epoch = steps_per_epoch
        self.backup = backup
        self._input = None
        # The batch the current epoch started at (the committed batch of a resumed epoch).
        self._first_batch = 0
        # Keras numbers a resumed epoch's batches from 0 (Keras 3) or from its first (tf-keras).
        self._numbered_from_first = False
        self._stop_resumed_epoch = False
        # Whether Keras cannot count the input's pass (TFRecord files: the elastic input can).
        self._stop_every_epoch = False
        # An epoch's end is committed after every callback's on_epoch_end (file writers
        # included), at the next epoch's start or the training's end.
        self._epoch_end_pending = False
        # Whether this `fit` call goes on after a recovery (fit_retry.retries_in_fit), and the
        # error of a commit it takes at the next batch's start.
        self._retries_in_fit = False
        self._commit_error: Exception | None = None

    def on_train_begin(self, logs: dict | None = None) -> None:
        runtime = runtime_lib.current()
        strategy = runtime.strategy
        if strategy is None:
            raise RuntimeError("create the ElasticMultiWorkerMirroredStrategy (and the model in "
                               "its scope) before calling fit")
        # The training input is the one the strategy distributed last: fit distributes it
        # before calling on_train_begin, its validation input later.
        self._input = getattr(strategy.extended, "latest_input", None)
        passes = None if self._input is None else self._input.batches_per_pass
        counted = self.params.get("steps")
        if self.steps_per_epoch is None:
            self.steps_per_epoch = counted or passes
        # Keras that cannot count the pass (TFRecord files: the elastic input counts them) would
        # wait for the input to run out, which it does not: at the epoch's last batch the input
        # is set to the next epoch's start (below). The callback stops each epoch there.
        self._stop_every_epoch = not counted and self.steps_per_epoch is not None
        if passes is not None and self.steps_per_epoch not in (None, passes):
            raise ValueError(
                f"steps_per_epoch={self.steps_per_epoch} but the input has {passes} global "
                f"batches per pass: an elastic epoch is one pass over a finite input; pass "
                f"steps_per_epoch={passes} (or none), or .repeat() the input")
        # A newcomer that warmed up joins here, its `fit` call started (see warm_up), before
        # anything that reads the state or the world size.
        runtime.join_in_step()
        _follow_world_size(self.model, strategy)
        if self._input is not None:
            with strategy.scope():
                _build_compiled_containers(self.model, self._input.element_spec)
        self._resume(passes)
        self._commit_error = None
        keras_3 = not _is_tf_keras(self.model)
        self._retries_in_fit = fit_retry.retries_in_fit(
            keras_3, keras_3 and _scale_losses_at_run_time(), runtime.training,
            self.commit_every, self.state.snapshot_every)

    def _resume(self, passes: int | None) -> None:
        """Makes this `fit` start at the committed (epoch, batch) rather than its initial epoch."""
        epoch, batch = self.state.epoch, self.state.batch
        self._first_batch = batch
        if _is_tf_keras(self.model):
            # tf-keras asks this object for the (epoch, step) to start at, after on_train_begin
            # (what its BackupAndRestore callback does), and runs only the epoch's rest.
            require(self.model, "_training_state")  # set here, read by tf-keras' fit
            self.model._training_state = _ResumeAt(epoch, batch)
            self._numbered_from_first = True
        else:
            # Keras 3 starts at model._initial_epoch (set by its BackupAndRestore callback too),
            # numbers the resumed epoch's batches from 0 and would run a whole epoch's worth:
            # the callback stops it after its rest. (Letting a finite input run out instead
            # would run one more, failing, step, whose ops that do not read the input, such
            # as the optimizer's step counter, run all the same.)
            require(self.model, "_initial_epoch")  # set here, read by Keras 3's fit
            self.model._initial_epoch = epoch
            self._stop_resumed_epoch = batch > 0
            if self._stop_resumed_epoch and not self.steps_per_epoch:
                raise ValueError("resuming an epoch of an input of unknown size needs "
                                 "steps_per_epoch")
        if self._input is not None:
            # tf-keras makes the first epoch's iterator before on_epoch_begin.
            self._input.seek(self._position(epoch, batch), epoch)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._commit_epoch_end(self._commit)
        if self.state.epoch != epoch:
            self._first_batch = 0
        self.state.epoch = epoch
        if self._input is not None:
            self._input.seek(self._position(epoch, self._first_batch), epoch)

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if self._retries_in_fit:
            start = (self.state.epoch, self.state.batch)
            if self._commit_error is not None:
                error, self._commit_error = self._commit_error, None
                self._recover(error, start)
            fit_retry.BatchRetry(self.model, lambda error: self._recover(error, start))

    def _recover(self, error: Exception, batch_start: tuple[int, int]) -> None:
        """After `error` ended the batch that started at `batch_start` (epoch, batch), or was
        raised by the commit before it: recovers as `tfe.run` does (back to the last commit or
        finish the step together, re-form, sync), then sets the input to that batch, which
        runs in this `fit` call (after the `fit` start's own collectives, when a member begins
        its `fit` call now: a failure in them is recovered from the same way); or raises (what
        the loop decided, or StepRestarts: every member enters `fit` again, from the synced
        state)."""
        runtime = runtime_lib.current()
        while True:
            beginning_fit = runtime.recover_in_step(self.state, error)
            synced_to = (self.state.epoch, self.state.batch)
            one_device_each = (runtime.strategy.num_replicas_in_sync
                               == runtime.membership.world_size)
            how = fit_retry.after_recovery(beginning_fit, self.state.last_synced, batch_start,
                                           synced_to, one_device_each)
            if isinstance(how, str):
                raise runtime_lib.StepRestarts(how)
            try:
                if how.with_new_fits:
                    self.model.reset_metrics()
                break
            except Exception as failed:  # noqa: BLE001 - the elastic loop's decision sorts it
                error = failed
        if self._input is not None:
            self._input.seek(self._position(*batch_start), batch_start[0])

    def _position(self, epoch: int, batch: int) -> int:
        """The input's global batch at (epoch, batch): within the pass, or the stream for an
        endless input."""
        if self._input.batches_per_pass is not None or not self.steps_per_epoch:
            return batch
        return epoch * self.steps_per_epoch + batch

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.state.batch = batch + 1 if self._numbered_from_first else \
            self._first_batch + batch + 1
        # The epoch's last batch is committed with the epoch's end: a failure during
        # validation then redoes that batch (rolled back) and the validation, rather than
        # resuming at the end of a pass with nothing left to train.
        last = self.steps_per_epoch is not None and self.state.batch >= self.steps_per_epoch
        if last and self._input is not None:
            # Keras may make the next epoch's iterator before that epoch's on_epoch_begin
            # (tf-keras always, Keras 3 given steps_per_epoch): it reads the next epoch's order.
            self._input.seek(self._position(self.state.epoch + 1, 0), self.state.epoch + 1)
        if last and (self._stop_resumed_epoch or self._stop_every_epoch):
            if not self.model.stop_training:
                self.model.stop_training = _EPOCH_OVER
        elif self.state.batch % self.commit_every == 0 and not last:
            self._commit()

    def _commit(self) -> None:
        """Commits. When this `fit` call goes on after a recovery, the commit's error (a change
        the members voted for) is taken at the next batch's start: the other callbacks see
        this batch end in the generation that trained it."""
        if not self._retries_in_fit:
            self.state.commit()
            return
        try:
            self.state.commit()
        except Exception as error:  # noqa: BLE001 - the elastic loop's decision sorts it
            self._commit_error = error

    def _raise_commit_error(self) -> None:
        """A commit's error this `fit` call has no batch left to take: the loop takes it."""
        if self._commit_error is not None:
            error, self._commit_error = self._commit_error, None
            raise error

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._raise_commit_error()
        if (self.steps_per_epoch and self.state.batch < self.steps_per_epoch
                and not self.model.stop_training):
            raise RuntimeError(
                f"epoch {epoch} ended after {self.state.batch} of its {self.steps_per_epoch} "
                f"batches: with Keras 3, leave steps_per_epoch out for a finite input (given, "
                f"Keras reuses the epoch's iterator and its count after a resumed epoch)")
        self._stop_resumed_epoch = False
        if self.model.stop_training is _EPOCH_OVER:
            # The epoch is over, not the training.
            self.model.stop_training = False
        self.state.epoch = epoch + 1
        self.state.batch = 0
        self._first_batch = 0
        self._epoch_end_pending = True

    def on_train_end(self, logs: dict | None = None) -> None:
        # A later fit without this callback starts where its own arguments say.
        if _is_tf_keras(self.model):
            self.model._training_state = None
        else:
            self.model._initial_epoch = None
        self._raise_commit_error()
        self._commit_epoch_end(self.state.commit)

    def _commit_epoch_end(self, commit: Callable[[], None]) -> None:
        if self._epoch_end_pending:
            self._epoch_end_pending = False
            try:
                commit()
            finally:
                # Also when the membership changes at this commit: it saved the epoch's end.
                if self.backup is not None and _is_chief():
                    self.state.write(self.backup)


class _ResumeAt:
    """What tf-keras' `fit` asks where to start (its worker training state's interface)."""

    def __init__(self, epoch: int, step: int):
        self._counters = (epoch, step)

    def maybe_load_initial_counters_from_ckpt(self, steps_per_epoch: int, initial_epoch: int,
                                              mode: Any = None) -> tuple[int, int]:
        del steps_per_epoch, initial_epoch, mode  # the committed state decides
        return self._counters


def _is_tf_keras(instance: Any) -> bool:
    """Whether `instance` (a model, a callback, or the class of one) is tf-keras' rather than
    Keras 3's."""
    of = instance if isinstance(instance, type) else type(instance)
    return any(cls.__module__.startswith("tf_keras.") for cls in of.__mro__)


class ChiefOnly(tf.keras.callbacks.Callback):
    """Runs `callback` on the current chief only: for callbacks that write files
    (ModelCheckpoint, TensorBoard, CSVLogger), which every worker would write otherwise.

    The chief can change at a re-form; the new chief's `callback` takes over
    at its next hook (within the same `fit` call when the call goes on after
    the re-form: it is given the model and begins the training and the epoch
    there), and a CSVLogger then appends to the file its
    predecessor wrote (`state` says whether training resumed). tf-keras'
    ModelCheckpoint and TensorBoard run on every worker: they write on the
    chief only by themselves (non-chiefs into a temporary directory, following
    the strategy's current chief), and their reads of the variables may be
    collectives every worker must join. The other members of a Keras 3
    `ModelCheckpoint(save_best_only=True)` follow its best value, so that a new
    chief saves only what beats the best its predecessor saved.
    """

    def __init__(self, callback: Any, state: State):
        super().__init__()
        self.callback = callback
        self.state = state
        self._everywhere = _is_tf_keras(callback) and isinstance(
            callback, (tf.keras.callbacks.ModelCheckpoint, tf.keras.callbacks.TensorBoard))
        # tf-keras hands logs as tensors only to callbacks that take them.
        self._supports_tf_logs = getattr(callback, "_supports_tf_logs", False)
        # Whether a `fit` call is under way, and whether the callback began it here (a member
        # that becomes the chief during it begins it then).
        self._training = False
        self._begun = False

    def set_model(self, model: Any) -> None:
        # Keras 3's TensorBoard writes the model's summary here: on the chief only.
        super().set_model(model)
        self._training = self._begun = False
        if self._runs_here() or self._follows_best():
            self.callback.set_model(model)

    def set_params(self, params: dict) -> None:
        super().set_params(params)
        self.callback.set_params(params)

    def _runs_here(self) -> bool:
        return self._everywhere or _is_chief()

    def _follows_best(self) -> bool:
        """Whether the other members follow the callback's best value (Keras 3 best-only
        checkpoints, which write nothing when given the model)."""
        return bool(getattr(self.callback, "save_best_only", False))

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._training = True
        # Before it asks who the chief is: a newcomer listed before the ElasticCallback joins
        # here (see warm_up).
        runtime = runtime_lib.current_or_none()
        if runtime is not None:
            runtime.join_in_step()
        if not self._runs_here():
            return
        if (self.state.epoch or self.state.batch) and hasattr(self.callback, "append"):
            self.callback.append = True
        self.callback.on_train_begin(logs)
        self._begun = True

    def _runs_from_here(self, hook: str, epoch: int | None = None) -> bool:
        """Whether the callback runs here; on a member that became the chief during this
        `fit` call (its predecessor was lost and the call went on) it first begins here the
        training and the epoch under way (`epoch`, by default the state's)."""
        if not self._runs_here():
            return False
        if self._training and not self._begun:
            if not self._follows_best():
                self.callback.set_model(self.model)
            self.on_train_begin()
            if hook not in ("on_epoch_begin", "on_train_end"):
                self.callback.on_epoch_begin(self.state.epoch if epoch is None else epoch)
        return True

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self._runs_from_here("on_epoch_end", epoch):
            self.callback.on_epoch_end(epoch, logs)
        elif self._follows_best():
            # A member that becomes chief later saves only what beats the best saved so far.
            current = (logs or {}).get(self.callback.monitor)
            if current is None:
                return
            if getattr(self.callback, "monitor_op", True) is None:
                # Keras 3 chooses the comparison at the first epoch's end, from the metrics.
                private(self.callback, "_set_monitor_op")()
            if private(self.callback, "_is_improvement")(current, self.callback.best):
                self.callback.best = current

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._runs_from_here("on_train_end"):
            self.callback.on_train_end(logs)
        self._training = False


def _on_chief(name: str) -> Callable[..., None]:
    def hook(self: ChiefOnly, *args: Any, **kwargs: Any) -> None:
        if self._runs_from_here(name):
            getattr(self.callback, name)(*args, **kwargs)

    hook.__name__ = name
    return hook


def _asks_wrapped(name: str) -> Callable[..., bool]:
    def implements(self: ChiefOnly) -> bool:
        return getattr(self.callback, name)()

    implements.__name__ = name
    return implements


for _hook in dir(tf.keras.callbacks.Callback):
    if _hook.startswith("on_") and _hook not in ("on_train_begin", "on_epoch_end",
                                                  "on_train_end"):
        setattr(ChiefOnly, _hook, _on_chief(_hook))
    elif _hook.startswith("_implements_"):
        # tf-keras calls a callback's batch hooks (and waits for each batch's logs) only
        # when it implements them: as the wrapped callback does.
        setattr(ChiefOnly, _hook, _asks_wrapped(_hook))


def _is_chief() -> bool:
    runtime = runtime_lib.current()
    return runtime.membership is not None and runtime.node_id == runtime.membership.chief_id


# Keras callbacks that write files: fit_elastic runs them through ChiefOnly.
_FILE_WRITERS = tuple(getattr(tf.keras.callbacks, name) for name in
                      ("ModelCheckpoint", "TensorBoard", "CSVLogger"))


def _build_compiled_containers(model: Any, element_spec: Any) -> None:
    """Builds tf-keras' compiled loss and metrics, which it otherwise builds at the first step.

    Every `fit` epoch starts with `reset_metrics()`, which under a multi-worker
    strategy all-reduces each metric variable it resets: a newcomer must hold
    the members' metrics before its first epoch, or its collectives pair with
    the wrong ones. (Keras 3 builds them before `fit` calls any callback.)
    """
    containers = [c for c in (getattr(model, "compiled_loss", None),
                              getattr(model, "compiled_metrics", None))
                  if c is not None and getattr(c, "built", True) is False]
    if not containers or not isinstance(element_spec, tuple) or len(element_spec) < 2:
        return

    def one_example(spec):
        if spec.shape.rank is None or None in spec.shape[1:]:
            raise ValueError(f"the input's element {spec} has an unknown shape")
        return tf.zeros([1, *spec.shape[1:]], spec.dtype)

    x, y = (tf.nest.map_structure(one_example, spec) for spec in element_spec[:2])
    y_pred = model(x, training=False)
    for container in containers:
        if type(container).__name__ == "LossesContainer":
            container.build(y_pred)
        else:
            container.build(y_pred, y)


def _scale_losses_at_run_time() -> bool:
    """Makes Keras 3 scale each replica's loss by the world size read when a step runs, under the
    elastic strategy; True once done.

    Keras 3 multiplies a replica's loss by 1 / `num_replicas_in_sync` (and its logged loss back),
    a Python number that its traced train function keeps: every re-form to another world size
    would need a new trace (about a second). Reading the strategy's world size variable instead
    lets one traced function serve every world size. Other strategies keep Keras' own scaling.
    """
    global _scaling_installed
    if _scaling_installed:
        return True
    try:
        from keras.src.losses import loss as keras_loss
    except ImportError:  # another Keras layout: its functions are retraced per world size
        return False
    original_scale = keras_loss.scale_loss_for_distribution
    original_unscale = keras_loss.unscale_loss_for_distribution
    if not (callable(original_scale) and callable(original_unscale)):
        return False

    def replicas(value):
        extended = tf.distribute.get_strategy().extended
        if not _is_elastic(extended):
            return None
        return tf.cast(extended.replicas_variable.read_value(), value.dtype)

    def scale(value):
        count = replicas(value)
        return original_scale(value) if count is None else value / count

    def unscale(value):
        count = replicas(value)
        return original_unscale(value) if count is None else value * count

    keras_loss.scale_loss_for_distribution = scale
    keras_loss.unscale_loss_for_distribution = unscale
    _scaling_installed = True
    return True


_scaling_installed = False


def _is_elastic(extended: Any) -> bool:
    """Whether `extended` (a strategy's) is the elastic strategy's: the only one under which the
    Keras functions replaced here act differently from Keras' own."""
    return isinstance(extended, ElasticExtended)


def _set_metrics_without_reading_them_back() -> bool:
    """Makes Keras 3 set a metric's variables (its reset) without reading them back across the
    workers, under the elastic strategy; True once done.

    Keras' assign returns the value it was given, but TensorFlow's assign of a sync-on-read
    variable (a metric's, under a multi-worker strategy) outside a replica also reads the
    variable back: an all-reduce per variable that every worker must join. `fit` resets the
    metrics at every epoch's start, so a node beginning its `fit` call (a newcomer) needed
    every member to run the same reset, and a failure in that reset ended its call. Without
    the read, the reset is each worker's own; other strategies keep Keras' assign. This covers
    every sync-on-read Keras variable assigned outside a replica, not only a metric's.
    """
    global _metric_assign_installed
    if _metric_assign_installed:
        return True
    try:
        from keras.src.backend.tensorflow import core as keras_tf_core
    except ImportError:  # another Keras layout
        keras_tf_core = None
    original = getattr(getattr(keras_tf_core, "Variable", None), "_direct_assign", None)
    if not callable(original):
        logger.warning("Keras metric resets stay collectives across the workers "
                       "(see docs/compatibility.md)")
        return False

    @functools.wraps(original)
    def direct_assign(variable, value):
        held = getattr(variable, "_value", None)
        if (isinstance(held, values_lib.SyncOnReadVariable)
                and _is_elastic(held.distribute_strategy.extended)):
            held.assign(tf.cast(value, held.dtype), read_value=False)
        else:
            original(variable, value)

    keras_tf_core.Variable._direct_assign = direct_assign
    _metric_assign_installed = True
    return True


_metric_assign_installed = False


def _follow_world_size(model: Any, strategy: Any) -> None:
    """Before the model trains: its train function serves the current world size (Keras 3's
    losses scaled at run time, one traced function for all; otherwise one traced per size)."""
    if _is_tf_keras(model) or not _scale_losses_at_run_time():
        _retrace_if_world_changed(model, strategy.num_replicas_in_sync)


def warm_up(model: Any, dataset: Any, steps: int = 1) -> bool:
    """On a node joining a running job: `model.fit` over the first `steps` global batches of
    `dataset`, now, alone, before it joins (`tensorflow_elastic.warm_up`); elsewhere does
    nothing. Returns whether it ran.

    Its train function is then traced and run before the members wait for the node: under
    Keras 3 it serves every world size, so the node's first step in the job traces nothing
    (tf-keras traces it again for the world size it joins). The state sync that admits the
    node replaces what these steps changed in the state (weights, optimizer, counters).

    Under Keras 3 the node then joins at its training `fit` call's start (in the
    ElasticCallback's on_train_begin), not before it: the members wait for neither its input's
    distribution nor the rest of `fit`'s start. (tf-keras joins before the call: its
    TensorBoard and ModelCheckpoint choose, as the call starts, whether this worker is the
    chief.)
    """
    if not warm_up_lib.joining():
        return False
    _follow_world_size(model, model.distribute_strategy)
    # The dataset as it is: the strategy's input takes only one that ends with its batch.
    model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0)
    if not _is_tf_keras(model):
        runtime_lib.current().join_at_fit_start()
    return True


def _retrace_if_world_changed(model: Any, world: int) -> None:
    """Gives the model the functions traced for `world` when it last trained at another world
    size: the ones kept from an earlier time at this size, or none (Keras traces anew)."""
    traced = _traced.setdefault(model, _Traced(world))
    if traced.world == world:
        return
    traced.functions[traced.world] = {name: getattr(model, name) for name in _FUNCTIONS
                                      if hasattr(model, name)}
    traced.world = world
    for name, function in traced.functions.get(world, {}).items():
        setattr(model, name, function)
    if world not in traced.functions:
        if getattr(model, "train_function", None) is not None:
            model.make_train_function(force=True)
        model.test_function = None
        model.predict_function = None


def fit_elastic(model: Any, state: State, dataset: Any, epochs: int,
                steps_per_epoch: int | None = None, callbacks: Iterable[Any] = (),
                commit_every: int = 1, backup: str | None = None, **fit_kwargs: Any) -> Any:
    """`model.fit` from where `state` says training is (epoch, batch), to the end.

    `dataset` is the batched `tf.data.Dataset` a plain `fit` would get; its
    last `batch` is the global batch. `steps_per_epoch` defaults to one pass
    over a finite input. Called again by `tensorflow_elastic.run` after a
    re-form, it first finishes the interrupted epoch from the committed batch,
    then runs the remaining ones. Callbacks that write files (ModelCheckpoint,
    TensorBoard, CSVLogger) run on the current chief only. `backup`: see
    `ElasticCallback`.
    """
    cardinality = int(dataset.cardinality())
    if steps_per_epoch is None and cardinality < 0 and isinstance(dataset, tf.data.Dataset):
        # Stock tf.data cannot count TFRecord files; the elastic input reads them by index.
        cardinality = global_batches_per_pass(dataset) or cardinality
    if steps_per_epoch is None and cardinality < 0:
        raise ValueError("the input is endless or of unknown size: pass steps_per_epoch")
    if steps_per_epoch is not None and steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
    elastic = ElasticCallback(state, commit_every, steps_per_epoch=steps_per_epoch or cardinality,
                              backup=backup)
    callbacks = [elastic, *(ChiefOnly(c, state) if isinstance(c, _FILE_WRITERS) else c
                            for c in callbacks)]
    # A finite input's epoch is its pass: Keras then makes a new iterator every epoch.
    return model.fit(dataset, epochs=epochs,
                     steps_per_epoch=None if steps_per_epoch == cardinality else steps_per_epoch,
                     callbacks=callbacks, **fit_kwargs)


# When this module loads (Keras 3 loaded with it), before any Keras code that uses it runs:
# every node's metric resets behave alike from the job's start, whatever ran before a `fit`.
if not _is_tf_keras(ElasticCallback):
    _set_metrics_without_reading_them_back()
