"""Who this worker is in the job now: ``tfe.rank()``, ``tfe.size()``, ``tfe.local_rank()``,
``tfe.is_chief()``.

Scripts ask these instead of reaching into the runtime. Rank, size and chief
are the current generation's and change only when the group re-forms (a
member left, failed or joined): between two steps, never inside one. Read them
in Python each time they are needed rather than once at the start; inside a
traced function they are constants of that trace. The local rank is fixed for
the life of the process.

A script run by ``tfelastic-run`` without ``tfe.init()`` (a plain
MultiWorkerMirroredStrategy script in the restart-based mode) gets them from
its ``TF_CONFIG``, which a membership change replaces by restarting it.
"""

from __future__ import annotations

import json
import os

from tensorflow_elastic import environment
from tensorflow_elastic.rendezvous import Membership
from tensorflow_elastic.strategy import runtime as runtime_lib


def rank() -> int:
    """This worker's index in the current generation, 0 to size() - 1 (members ranked by node id).

    Changes at a re-form when a member with a lower node id leaves or fails.
    """
    membership = _membership()
    return membership.rank if membership is not None else _tf_config()[0]


def size() -> int:
    """The number of workers in the current generation; changes at every re-form."""
    membership = _membership()
    return membership.world_size if membership is not None else _tf_config()[1]


def local_rank() -> int:
    """This worker's slot among its launcher's workers (0 if no launcher started it); fixed."""
    return environment.integer(environment.LOCAL_RANK, 0)


def is_chief() -> bool:
    """Whether this worker is the chief (the member with the lowest node id) of the current
    generation; passes to the next-lowest id at the re-form after the chief leaves."""
    membership = _membership()
    return membership.is_chief if membership is not None else _tf_config()[0] == 0


def _membership() -> Membership | None:
    """The runtime's current generation; None in a worker that never called init()."""
    runtime = runtime_lib.current_or_none()
    if runtime is None:
        return None
    membership = runtime.membership
    if membership is None:
        raise RuntimeError("this worker is not a member of a generation yet (it waits to join); "
                           "ask for its rank once tfe.run or the strategy has started")
    return membership


def _tf_config() -> tuple[int, int]:
    """(task index, number of workers) from TF_CONFIG, for scripts that did not call init()."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        runtime_lib.current()  # raises, saying init() has not been called
    try:
        config = json.loads(raw)
        return int(config["task"]["index"]), len(config["cluster"]["worker"])
    except (ValueError, KeyError, TypeError) as e:
        raise RuntimeError(f"TF_CONFIG does not name this worker's task ({e}); call "
                           f"tensorflow_elastic.init() or run under tfelastic-run") from e
