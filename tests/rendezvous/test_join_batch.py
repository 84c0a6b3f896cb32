"""The joins of one call are joined together: one commit and one wait for the generation for
them all, each with its own answer."""

from __future__ import annotations

import asyncio

from tensorflow_elastic.observability.events import EventLog
from tensorflow_elastic.rendezvous.errors import RendezvousError, RendezvousTimeoutError
from tensorflow_elastic.rendezvous.metrics import Metrics
from tensorflow_elastic.rendezvous.run import Run
from tensorflow_elastic.rendezvous.run_state import RunState
from tensorflow_elastic.rendezvous.settings import RunSettings
from tensorflow_elastic.rendezvous.store import MemoryStore
from tensorflow_elastic.rendezvous.types import JoinEntry, Membership

_SETTINGS = RunSettings(heartbeat_timeout=5.0, last_call=0.0)


def _run(nodes: int) -> Run:
    return Run(RunState.new("job", nodes, nodes, _SETTINGS), _SETTINGS, MemoryStore(),
               EventLog(None), Metrics())


def _entry(port: int, timeout: float = 10.0) -> JoinEntry:
    return JoinEntry(f"127.0.0.1:{port}", None, 0, f"n{port}", timeout)


def test_newcomers_joined_together_are_committed_once_and_each_answered():
    async def scenario() -> tuple[int, list]:
        run = _run(4)
        run.start()
        before = run.version
        batch = asyncio.create_task(run.join_many([_entry(24000 + i) for i in range(3)]))
        await asyncio.sleep(0.1)  # 3 of 4 queued: no generation yet
        commits = run.version - before
        fourth, = await run.join_many([_entry(24003)])
        answers = await batch
        await run.close()
        return commits, answers + [fourth]

    commits, answers = asyncio.run(scenario())
    assert commits == 1
    assert all(isinstance(a, Membership) and a.generation == 1 for a in answers)
    assert sorted(a.node_id for a in answers) == [0, 1, 2, 3]


def test_each_entry_of_a_batch_keeps_its_own_timeout_and_error():
    async def scenario() -> list:
        run = _run(3)
        run.start()
        answers = await run.join_many([_entry(24010, timeout=0.2), _entry(24011, timeout=0.4),
                                       JoinEntry("127.0.0.1:24012", 7, 0, "", 10.0)])
        await run.close()
        return answers

    short, longer, unknown = asyncio.run(scenario())
    assert isinstance(short, RendezvousTimeoutError) and "0.2 s" in short.message
    assert isinstance(longer, RendezvousTimeoutError) and "0.4 s" in longer.message
    assert isinstance(unknown, RendezvousError) and "7" in unknown.message


def test_a_batch_answers_a_node_removed_while_waiting_and_the_others_once_formed():
    async def scenario() -> tuple[list, list[str]]:
        run = _run(3)
        run.start()
        batch = asyncio.create_task(run.join_many([_entry(24020), _entry(24021)]))
        await asyncio.sleep(0.1)
        await run.leave(0, "preempted")  # node 0 leaves while its batch waits
        others = await run.join_many([_entry(24022), _entry(24023)])
        answers = await batch
        history = [entry["event"] for entry in run.status().history]
        await run.close()
        return answers + others, history

    (left, *joined), history = asyncio.run(scenario())
    assert isinstance(left, RendezvousError) and "left: preempted" in left.message
    assert all(isinstance(a, Membership) and a.generation == 1 for a in joined)
    assert sorted(a.node_id for a in joined) == [1, 2, 3]
    assert "rendezvous_complete" in history  # every member was answered, so knows it
