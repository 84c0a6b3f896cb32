"""The events record: JSON lines that several processes append to."""

import json
import multiprocessing

from tensorflow_elastic import environment
from tensorflow_elastic.observability import events


def test_record_writes_required_fields(tmp_path):
    path = tmp_path / "sub" / "events.jsonl"
    log = events.EventLog(str(path), source="agent")
    entry = log.record(events.NODE_JOINED, node=3, generation=2, address="127.0.0.1:1")
    log.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 1
    written = json.loads(lines[0])
    assert written == entry
    assert {"time", "event", "node", "generation"} <= set(written)
    assert written["event"] == "node_joined" and written["node"] == 3 and written["source"] == "agent"


def test_disabled_log_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(environment.EVENTS_FILE, raising=False)
    log = events.EventLog()
    assert not log.enabled
    assert log.record(events.STEP, step=1) is None
    assert list(tmp_path.iterdir()) == []


def test_path_comes_from_the_environment(tmp_path, monkeypatch):
    path = tmp_path / "env.jsonl"
    monkeypatch.setenv(environment.EVENTS_FILE, str(path))
    events.EventLog().record(events.JOB_COMPLETE)
    assert [e["event"] for e in events.read_events(str(path))] == ["job_complete"]


def _append_many(path, writer, count):
    log = events.EventLog(path)
    for i in range(count):
        log.record(events.STEP, node=writer, step=i, padding="x" * 512)


def test_concurrent_processes_never_interleave_lines(tmp_path):
    path = str(tmp_path / "events.jsonl")
    procs = [multiprocessing.get_context("spawn").Process(target=_append_many, args=(path, w, 200))
             for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    entries = list(events.read_events(path))
    assert len(entries) == 800
    for writer in range(4):
        assert [e["step"] for e in entries if e["node"] == writer] == list(range(200))


def test_reader_filters_and_skips_a_torn_last_line(tmp_path):
    path = tmp_path / "events.jsonl"
    log = events.EventLog(str(path))
    log.record(events.STEP, step=1)
    log.record(events.NODE_LEFT, node=2)
    log.close()
    with open(path, "a") as f:
        f.write('{"event": "step", "ti')
    assert [e["event"] for e in events.read_events(str(path))] == ["step", "node_left"]
    assert [e["node"] for e in events.read_events(str(path), event=events.NODE_LEFT)] == [2]
