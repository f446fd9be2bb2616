"""ControlLink (a session actor's batched side of the run's control actor) against the real RunControl.

RunControl is a plain class (``start_control`` makes it an actor); here its methods are called in the
test's own loop through a stand-in for the actor handle's ``.remote``, so batching and the answers can be
checked call by call. The whole path through real Ray actors runs in the pipeline tests (tests/test_drain.py,
tests/test_durability.py)."""

from __future__ import annotations

import asyncio

import pytest

from raygen.distributed.control import RunControl
from raygen.distributed.control_link import ControlLink


class _Handle:
    """What ``ControlLink`` uses of an actor handle: ``handle.exchange.remote(...)`` -> awaitable."""

    def __init__(self, control: RunControl, fail: bool = False):
        self.control, self.fail, self.calls = control, fail, []
        self.exchange = self

    def remote(self, finished, released, begins):
        self.calls.append((list(finished), list(released), list(begins)))
        if self.fail:
            raise RuntimeError("control actor died")
        return self.control.exchange(finished, released, begins)


def run(coro):
    return asyncio.run(coro)


def test_questions_and_records_that_come_together_travel_in_one_call():
    async def main():
        handle = _Handle(RunControl())
        link = ControlLink(handle)
        answers = await asyncio.gather(*(link.begin(f"s{i}", 1) for i in range(20)))
        assert answers == ["run"] * 20
        assert len(handle.calls) == 1
        done = [link.finish(f"s{i}", 1, f'{{"id": {i}}}', "{}") for i in range(20)]
        await asyncio.gather(*done)
        assert len(handle.calls) == 2 and len(handle.calls[1][0]) == 20
        state = await handle.control.state()
        assert state == {"running": 0, "finished": 20, "skipped": 0}
        records = await handle.control.take(0.1)
        assert [r for r, _ in records] == [f'{{"id": {i}}}' for i in range(20)]

    run(main())


def test_a_finished_sample_is_not_run_again_and_a_drain_is_learned_for_good():
    async def main():
        handle = _Handle(RunControl())
        link = ControlLink(handle)
        assert await link.begin("a", 1) == "run"
        await link.finish("a", 1, "{}", "{}")
        assert await link.begin("a", 1) == "finished"  # an actor's task re-run after it died
        assert await link.begin("a", 2) == "run"  # the next attempt is another session
        assert await link.begin("b", 1) == "run"
        await handle.control.drain()
        assert not link.draining
        link.release("b", 1)  # told to run, then met the drain while waiting for a slot
        assert await link.begin("c", 1) == "draining"
        assert link.draining
        state = await handle.control.state()
        assert state["running"] == 1  # a@2 only: b was released
        assert state["skipped"] == 2

    run(main())


def test_any_reply_carries_the_drain():
    async def main():
        handle = _Handle(RunControl())
        link = ControlLink(handle)
        assert await link.begin("a", 1) == "run"
        await handle.control.drain()
        await link.finish("a", 1, "{}", "{}")  # no question asked: the reply still says it
        assert link.draining

    run(main())


def test_a_lost_control_actor_fails_every_waiting_session():
    async def main():
        link = ControlLink(_Handle(RunControl(), fail=True))
        begins = [link.begin(f"s{i}", 1) for i in range(3)]
        results = await asyncio.gather(*begins, return_exceptions=True)
        assert all(isinstance(r, RuntimeError) for r in results)
        with pytest.raises(RuntimeError):
            await link.finish("x", 1, "{}", "{}")

    run(main())


def test_a_lone_question_is_answered_without_company():
    async def main():
        link = ControlLink(_Handle(RunControl()))
        assert await asyncio.wait_for(link.begin("a", 1), timeout=30) == "run"
        assert await asyncio.wait_for(link.begin("b", 1), timeout=30) == "run"  # the sender restarts

    run(main())


def test_a_drain_reaches_an_actor_with_nothing_to_send():
    """Samples wait for slots while long sessions run: the drain must reach them without any record or
    question going out (the link polls)."""

    async def main():
        handle = _Handle(RunControl())
        link = ControlLink(handle)
        assert await link.begin("a", 1) == "run"
        calls = len(handle.calls)
        await handle.control.drain()
        for _ in range(200):
            if link.draining:
                break
            await asyncio.sleep(0.05)
        assert link.draining
        assert len(handle.calls) > calls and handle.calls[-1] == ([], [], [])

    run(main())


def test_records_are_always_taken_but_new_sessions_wait_while_the_driver_is_behind(monkeypatch):
    import raygen.distributed.control as control_module

    monkeypatch.setattr(control_module, "_QUEUE_RECORDS", 4)

    async def main():
        control = RunControl()
        link = ControlLink(_Handle(control))
        assert await asyncio.gather(*(link.begin(f"s{i}", 1) for i in range(6))) == ["run"] * 6
        for _ in range(6):
            link.started()
        await asyncio.gather(*(link.finish(f"s{i}", 1, "{}", "{}") for i in range(6)))
        # Every record left the actor though 6 > 4 wait for the driver...
        assert (await control.state())["finished"] == 6
        # ...but a new session waits until the driver has taken them.
        asking = asyncio.ensure_future(link.begin("next", 1))
        await asyncio.sleep(0.3)
        assert not asking.done()
        assert len(await control.take(0.1)) == 6
        assert await asyncio.wait_for(asking, timeout=30) == "run"

    run(main())


def test_a_sample_asked_again_after_its_actor_died_no_longer_counts_as_running():
    async def main():
        control = RunControl()
        link = ControlLink(_Handle(control))
        assert await link.begin("a", 1) == "run"  # then the actor dies while "a" waits for a slot
        await control.drain()
        assert await ControlLink(_Handle(control)).begin("a", 1) == "draining"  # the task's re-run
        assert (await control.state())["running"] == 0  # the drain need not wait for its timeout

    run(main())


def test_a_question_cancelled_before_its_answer_gives_the_permission_back():
    async def main():
        control = RunControl()
        link = ControlLink(_Handle(control))
        asking = asyncio.ensure_future(link.begin("a", 1))
        await asyncio.sleep(0)
        asking.cancel()
        released = []
        for _ in range(200):
            await asyncio.sleep(0.02)
            released = [call for call in link._control.calls if call[1]]
            if released:
                break
        assert released == [([], [("a", 1)], [])]  # the permission went back
        assert (await control.state())["running"] == 0
        assert link.waiting == 0

    run(main())
