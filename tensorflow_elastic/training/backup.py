"""A custom loop's backup: resume from it at the start, write it every few commits.

The state itself survives failures in the workers; a backup is for the job
restarted as a whole (every node lost, a new allocation). It goes through
training/checkpoints.py: any filesystem TensorFlow reaches, the latest ``keep``
checkpoints kept, each replacing the last at once.
"""

from __future__ import annotations

from tensorflow_elastic import world
from tensorflow_elastic.training.state import TensorFlowState


class Backup:
    """``restore()`` before ``tfe.run``; ``after_commit()`` after each ``state.commit()``: the
    chief writes the committed state every ``every`` commits."""

    def __init__(self, state: TensorFlowState, path: str, every: int = 100, keep: int = 3):
        if every < 1 or keep < 1:
            raise ValueError(f"every and keep must be >= 1, got every={every}, keep={keep}")
        self.state = state
        self.path = path
        self.every = every
        self.keep = keep

    def restore(self) -> bool:
        """Loads the latest checkpoint at ``path`` into the state; False when there is none."""
        return self.state.read(self.path)

    def after_commit(self) -> bool:
        """Writes on the chief when the commit count is a multiple of ``every``; returns
        whether it wrote."""
        if self.state.commits % self.every or not world.is_chief():
            return False
        return self.state.write(self.path, self.keep)
