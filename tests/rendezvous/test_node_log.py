"""A run saved as a header and a log of changed node records: what a load gives back, what a
save writes, and saves cut short (the file store here; etcd in test_etcd_store.py)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import time

import pytest

from tensorflow_elastic.rendezvous import node_log
from tensorflow_elastic.rendezvous.node_log import RangeCache, id_ranges, ids_in
from tensorflow_elastic.rendezvous.run_state import RunState, decode, encode
from tensorflow_elastic.rendezvous.settings import RunSettings
from tensorflow_elastic.rendezvous.store import FileStore, MembershipStore
from tensorflow_elastic.rendezvous.types import Phase


class Saver:
    """Saves a state as the orchestrator does: the records changed since the last save."""

    def __init__(self, store: MembershipStore, state: RunState):
        self.store, self.state, self.ranges = store, state, RangeCache()

    def save(self) -> None:
        snapshot = encode(self.state, self.state.take_changed(), self.ranges)
        self.store.save(self.state.run_id, snapshot)


def new_state(run_id: str = "job") -> RunState:
    return RunState.new(run_id, 1, 100_000, RunSettings())


def join(state: RunState, count: int, address_bytes: int = 0) -> list[int]:
    ids = []
    for _ in range(count):
        node = state.register(f"10.0.0.{state.next_id % 250}:{20000 + state.next_id}"
                              + "x" * address_bytes, f"nonce-{state.next_id}")
        state.enqueue(node)
        state.note("node_joined", [node.node_id], f"address {node.address}", time.time())
        ids.append(node.node_id)
    return ids


def run_a_job(saver: Saver, nodes: int, address_bytes: int = 0) -> None:
    """Joins in batches, a formation, deaths and a re-form, a removed node taken back, a
    standby: a save after each step."""
    state = saver.state
    for _ in range(4):
        join(state, nodes // 4, address_bytes)
        saver.save()
    ids = state.form(state.next_members(), "the last call ended")
    state.note("generation_start", ids, "formed", time.time())
    saver.save()
    state.remove([ids[3], ids[7]], "no heartbeat", failed=True, may_return=True)
    state.form(state.next_members([ids[3], ids[7]]), "lost two")
    saver.save()
    state.take_back(ids[3], state.returnable[ids[3]], "nonce-again")
    state.enqueue(state.nodes[ids[3]])
    state.register("10.9.9.9:1", "standby")
    saver.save()
    saver.save()  # nothing changed


def assert_same(loaded: RunState, state: RunState) -> None:
    assert loaded.nodes == state.nodes and loaded.members == state.members
    assert list(loaded.waiting) == sorted(state.waiting) and loaded.registered() == \
        state.registered()
    assert (loaded.generation, loaded.phase, loaded.next_id) == \
        (state.generation, state.phase, state.next_id)
    assert loaded.past == state.past and list(loaded.history) == list(state.history)
    assert loaded.removed == state.removed and loaded.returnable == state.returnable
    assert loaded.nonces == state.nonces


def load(store: MembershipStore, run_id: str = "job") -> RunState:
    return decode(store.load()[run_id], RunSettings())


def _logs(directory) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(".nodes"))


def test_id_ranges_and_back():
    assert id_ranges([5, 1, 2, 3, 9, 10]) == [[1, 3], [5, 5], [9, 10]]
    assert ids_in(id_ranges(range(1000))) == list(range(1000)) and id_ranges([]) == []
    with pytest.raises(ValueError, match="not an id range"):
        ids_in([[3, 1]])


def test_a_run_saved_change_by_change_loads_as_it_was(tmp_path):
    state = new_state()
    store = FileStore(str(tmp_path))
    run_a_job(Saver(store, state), 2000)
    store.close()
    store = FileStore(str(tmp_path))
    assert_same(load(store), state)
    assert len(_logs(tmp_path)) == 1  # the formation wrote a new base; the former one went
    # The loaded store goes on from where it was.
    join(state, 3)
    Saver(store, state).save()
    assert_same(load(store), state)


def test_a_save_writes_what_changed_not_the_run(tmp_path):
    state = new_state()
    store = FileStore(str(tmp_path))
    saver = Saver(store, state)
    join(state, 5000)
    saver.save()
    [log] = _logs(tmp_path)
    before = os.path.getsize(tmp_path / log)
    join(state, 1)
    saver.save()
    assert os.path.getsize(tmp_path / log) - before < 200  # one record
    header = json.loads(_header(tmp_path))
    assert node_log.CHANGES_FIELD not in header and "waiting" not in header
    assert len(_header(tmp_path)) < 32 * 1024  # the last 100 history entries, no node list


def _header(directory) -> str:
    [name] = [n for n in os.listdir(directory) if n.endswith(".run.json")]
    return (directory / name).read_text()


class _CutShort(Exception):
    pass


@pytest.mark.parametrize("new_base", [False, True], ids=["appended", "new base"])
def test_a_save_cut_short_between_its_two_writes_loads_the_save_before(tmp_path, monkeypatch,
                                                                       new_base):
    state = new_state()
    store = FileStore(str(tmp_path))
    saver = Saver(store, state)
    join(state, 50)
    saver.save()
    expected = decode(encode(state), RunSettings())
    join(state, node_log.COMPACT_SLACK + 10 if new_base else 5)  # enough for a new base

    def cut_short(*_):
        raise _CutShort()

    monkeypatch.setattr(FileStore, "_replace_header", cut_short)
    with pytest.raises(_CutShort):
        saver.save()
    monkeypatch.undo()
    assert len(_logs(tmp_path)) == (2 if new_base else 1)
    store.close()
    store = FileStore(str(tmp_path))
    assert_same(load(store), expected)
    assert len(_logs(tmp_path)) == 1  # a new base no header names is dropped
    # The next orchestrator's saves go on from the save before (the cut-off bytes are gone).
    loaded = load(store)
    join(loaded, 2)
    Saver(store, loaded).save()
    store.close()
    assert_same(load(FileStore(str(tmp_path))), loaded)


def test_after_a_failed_directory_sync_the_next_save_leaves_what_the_header_covers(
        tmp_path, monkeypatch):
    state = new_state()
    store = FileStore(str(tmp_path))
    saver = Saver(store, state)
    join(state, 50)
    saver.save()
    join(state, 5)
    failed = state.take_changed()

    def sync_fails():
        raise OSError(errno.EIO, "Input/output error")

    # The header's rename happened; the sync after it failed: the header on disk covers it.
    monkeypatch.setattr(store, "_sync_directory", sync_fails)
    with pytest.raises(OSError, match="Input/output"):
        store.save("job", encode(state, failed, saver.ranges))
    monkeypatch.undo()
    expected = decode(encode(state), RunSettings())
    # The next save (with what did not save) is cut short before its header.
    join(state, 1)
    monkeypatch.setattr(FileStore, "_replace_header", lambda *_: _raise(_CutShort()))
    with pytest.raises(_CutShort):
        store.save("job", encode(state, failed | state.take_changed(), saver.ranges))
    monkeypatch.undo()
    store.close()
    store = FileStore(str(tmp_path))
    assert_same(load(store), expected)  # not set aside as cut
    assert len(_logs(tmp_path)) == 1


def test_a_delete_cut_short_leaves_no_log_and_a_run_set_aside_keeps_its_own(tmp_path):
    store = FileStore(str(tmp_path))
    for run_id in ("deleted", "unreadable", "kept"):
        state = new_state(run_id)
        join(state, 3)
        Saver(store, state).save()
    store.close()
    digests = {run_id: hashlib.sha256(run_id.encode()).hexdigest()
               for run_id in ("deleted", "unreadable")}
    os.unlink(tmp_path / f"{digests['deleted']}.run.json")  # the delete's first step only
    (tmp_path / f"{digests['unreadable']}.run.json").write_text("{not json")
    store = FileStore(str(tmp_path))
    assert sorted(store.load()) == ["kept"]
    assert [name.split(".")[0] for name in _logs(tmp_path)].count(digests["deleted"]) == 0
    assert [name.split(".")[0] for name in _logs(tmp_path)].count(digests["unreadable"]) == 1
    assert len(_logs(tmp_path)) == 2


def _raise(error: Exception):
    raise error


def _whole_snapshot(state: RunState) -> dict:
    """``state`` as the former format saved it: every node in every snapshot."""
    def nodes(ids):
        return [[i, state.nodes[i].address, state.nodes[i].nonce] for i in sorted(ids)]

    snapshot = encode(state)
    for field in (node_log.CHANGES_FIELD, "members_gone"):
        del snapshot[field]
    snapshot.update(format=1, members=nodes(state.members), waiting=nodes(state.waiting),
                    registered=nodes(state.registered()),
                    past=[[g, sorted(ids)] for g, ids in state.past.items()],
                    history=list(state.history))
    return snapshot


def test_a_state_dir_of_the_whole_snapshot_format_loads_and_its_next_save_writes_the_log(
        tmp_path):
    state = new_state()
    join(state, 30)
    state.form(state.next_members(), "formed")
    join(state, 3)
    state.register("10.9.9.9:1", "standby")
    (tmp_path / (hashlib.sha256(b"job").hexdigest() + ".run.json")).write_text(
        json.dumps(_whole_snapshot(state)))
    store = FileStore(str(tmp_path))
    loaded = load(store)
    assert_same(loaded, state)
    assert loaded.phase == Phase.ACTIVE and not _logs(tmp_path)
    Saver(store, loaded).save()  # every node, since the store has none of them yet
    store.close()
    assert _logs(tmp_path)
    assert_same(load(FileStore(str(tmp_path))), state)


def test_a_snapshot_of_an_unknown_format_says_which_ones_are_read():
    snapshot = encode(new_state())
    snapshot["format"] = 99
    with pytest.raises(ValueError, match="unknown state format 99; this orchestrator reads "
                                         "formats 1 and 2"):
        decode(snapshot, RunSettings())
