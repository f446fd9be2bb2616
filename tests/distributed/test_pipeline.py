"""The driver's loop of a pass (``pipeline.collect_records``) against the real RunControl.

RunControl is a plain class (``start_control`` makes it an actor); here it runs on an event loop of its
own thread and the loop calls it as the driver calls the actor, so the order of events around a drain can
be set exactly. The whole path through real Ray actors runs in tests/test_drain.py and
tests/test_durability.py."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading

import pytest

from raygen.distributed.control import RunControl
from raygen.distributed.pipeline import collect_records
from raygen.output.summary import SessionSummary
from raygen.run.drain import Drain


def _summary(key: str) -> str:
    return json.dumps(dataclasses.asdict(SessionSummary(key, key, 0, None, 1, "completed", True)))


class _Calls:
    """The driver's side (``take``, ``state``, ``drain``) over a RunControl on its own loop, plus
    ``actor_exchange`` for what a session actor sends. ``before_state`` runs just before each ``state``:
    news that reaches the control actor between the driver's take and its look at the state."""

    def __init__(self):
        self.control = RunControl()
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.before_state = lambda: None

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)

    def take(self, wait_s):
        return self._call(self.control.take(wait_s))

    def state(self):
        self.before_state()
        return self._call(self.control.state())

    def drain(self):
        self._call(self.control.drain())

    def actor_exchange(self, finished=(), begins=()):
        return self._call(self.control.exchange(list(finished), [], list(begins)))

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)


class _Consumer:
    def __init__(self):
        self.done = threading.Event()

    def raise_error(self):
        pass


@pytest.fixture
def calls():
    c = _Calls()
    yield c
    c.close()


def test_records_that_arrive_as_the_drain_sees_nothing_running_are_kept(calls):
    # Four sessions run; a drain is requested; their records arrive in one batch right after the driver's
    # last take came back empty, so the next look at the state finds nothing running.
    keys = [f"s{i}" for i in range(4)]
    assert calls.actor_exchange(begins=[(k, 1) for k in keys]) == (["run"] * 4, False)
    drain = Drain(timeout_s=60)
    drain.request()
    consumer = _Consumer()

    def finish_all_once():
        if not consumer.done.is_set():
            calls.actor_exchange(finished=[(k, 1, json.dumps({"id": k}), _summary(k)) for k in keys])
            consumer.done.set()  # Ray Data's iteration ends once the actors skip the rest

    calls.before_state = finish_all_once
    got = []
    collect_records(calls, consumer, lambda record, s: got.append(s.sample_key), lambda: None, drain)
    assert sorted(got) == keys


def test_a_pass_returns_once_the_iteration_ended_and_every_record_is_taken(calls):
    keys = [f"s{i}" for i in range(3)]
    calls.actor_exchange(begins=[(k, 1) for k in keys])
    calls.actor_exchange(finished=[(k, 1, json.dumps({"id": k}), _summary(k)) for k in keys])
    consumer = _Consumer()
    consumer.done.set()
    got = []
    collect_records(calls, consumer, lambda record, s: got.append(s.sample_key), lambda: None, None)
    assert sorted(got) == keys
