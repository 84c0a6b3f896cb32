"""Exactly once over a simulated membership schedule, in one process.

Each simulated worker holds its own variables and iterator, as a real one
does. The schedule grows 2 -> 3 workers, then kills the chief in the middle of
a step (its peers have already taken their batches) and the survivors roll
back to the last commit and re-form as 2: over the committed steps every id is
consumed exactly once, and each committed global batch is the same contiguous
run a single process would have read.
"""

import pytest

GLOBAL_BATCH = 8  # not divisible by 3: uneven slices while 3 workers run


class Job:
    """Members by permanent id; rank is the position in id order (the strategy's rule)."""

    def __init__(self, elastic, source_kind, num_ids):
        self.elastic = elastic
        self.make_source = lambda: elastic.sources[source_kind](num_ids)
        self.workers = {}
        self.committed_cursor = 0
        self.committed_ids = []

    def reform(self, member_ids):
        members = sorted(member_ids)
        for member_id in list(self.workers):
            if member_id not in members:
                del self.workers[member_id]
        for rank, member_id in enumerate(members):
            if member_id in self.workers:
                self.workers[member_id].join(len(members), rank)
            else:
                # A newcomer gets the cursor from the chief's committed state.
                self.workers[member_id] = self.elastic.make_worker(
                    self.make_source(), GLOBAL_BATCH, len(members), rank,
                    cursor=self.committed_cursor)

    def ranked(self):
        return [self.workers[member_id] for member_id in sorted(self.workers)]

    def step(self):
        """One synchronous step; returns False at the end of the pass."""
        batches = []
        for worker in self.ranked():
            try:
                batches.append(worker.next_ids())
            except StopIteration:
                batches.append(None)
        if all(batch is None for batch in batches):
            return False
        assert None not in batches, "workers disagree on the end of the pass"
        global_batch = [i for batch in batches for i in batch]
        start = self.committed_cursor * GLOBAL_BATCH
        assert global_batch == list(range(start, start + len(global_batch)))
        self.commit(global_batch)
        return True

    def commit(self, global_batch):
        cursors = {int(worker.dataset.cursor) for worker in self.ranked()}
        assert cursors == {self.committed_cursor + 1}
        self.committed_cursor += 1
        self.committed_ids += global_batch

    def kill_mid_step(self, victim):
        """The victim dies after its peers took their batches; nothing is committed."""
        for member_id in sorted(self.workers):
            if member_id != victim:
                self.workers[member_id].next_ids()
        del self.workers[victim]
        for worker in self.workers.values():  # State.restore()
            worker.dataset.cursor.assign(self.committed_cursor)


@pytest.mark.parametrize("num_ids", [160, 163])  # whole and partial last global batch
def test_every_id_is_consumed_exactly_once_across_resizes_and_a_kill(elastic, source_kind,
                                                                      num_ids):
    job = Job(elastic, source_kind, num_ids)
    job.reform([0, 1])
    for _ in range(3):
        assert job.step()
    job.reform([0, 1, 2])
    for _ in range(5):
        assert job.step()
    job.kill_mid_step(victim=0)
    job.reform([1, 2])
    steps = 0
    while job.step():
        steps += 1
        assert steps < 100
    assert sorted(job.committed_ids) == list(range(num_ids))
    assert len(job.committed_ids) == len(set(job.committed_ids))
    assert {int(worker.dataset.cursor) for worker in job.ranked()} == {0}


def test_a_second_pass_after_the_end_replays_the_epoch(elastic):
    job = Job(elastic, "range", 40)
    job.reform([0, 1, 2])
    while job.step():
        pass
    for worker in job.ranked():
        worker.iterator = iter(worker.dataset)
    job.committed_cursor = 0
    while job.step():
        pass
    assert sorted(job.committed_ids) == sorted(list(range(40)) * 2)
