"""The wake-up the joins of a run share: one wake releases them all, each times out alone."""

from __future__ import annotations

import asyncio

from tensorflow_elastic.rendezvous.wake import Wake


def test_one_wake_releases_every_waiting_call_and_later_calls_wait_for_the_next():
    async def scenario():
        wake = Wake()
        waits = [asyncio.ensure_future(wake.wait(60.0)) for _ in range(1000)]
        await asyncio.sleep(0)
        tasks_while_waiting = len(asyncio.all_tasks())
        wake.wake()
        woken = await asyncio.gather(*waits)
        late = asyncio.ensure_future(wake.wait(0.05))
        return tasks_while_waiting, woken, await late

    tasks_while_waiting, woken, late = asyncio.run(scenario())
    assert woken == [True] * 1000
    assert late is False  # it came after the wake: it timed out
    # The waiting calls and this test's own task: no task of their own each (wait_for's).
    assert tasks_while_waiting == 1001


def test_waits_that_time_out_or_are_cancelled_are_not_kept_without_end():
    async def scenario():
        wake = Wake()
        for _ in range(100):
            assert await wake.wait(0.0) is False
        cancelled = asyncio.ensure_future(wake.wait(60.0))
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        kept = len(wake._waiters)
        staying = asyncio.ensure_future(wake.wait(60.0))
        await asyncio.sleep(0)
        wake.wake()
        return kept, await staying

    kept, staying = asyncio.run(scenario())
    assert kept <= 2
    assert staying is True


def test_a_closed_waiting_call_leaves_the_wake_usable():
    # A pending join destroyed with its loop is closed, not cancelled: its wait must end quietly.
    async def scenario():
        wake = Wake()
        waiting = wake.wait(60.0)
        waiting.send(None)  # it now awaits its future
        waiting.close()
        woken = asyncio.ensure_future(wake.wait(60.0))
        await asyncio.sleep(0)
        wake.wake()
        return await woken

    assert asyncio.run(scenario()) is True
