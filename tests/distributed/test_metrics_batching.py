"""A session actor's metrics add up locally and reach Ray together (``WorkerMetrics``), no Ray cluster
needed: the Ray metric objects are replaced by recorders. The export end to end is test_metrics.py."""

from __future__ import annotations

import asyncio

from raygen.distributed import metrics as metrics_module
from raygen.distributed.metrics import WorkerMetrics


class _Recorder:
    def __init__(self, log: list, name: str):
        self.log, self.name = log, name

    def inc(self, amount, tags):
        self.log.append((self.name, "inc", amount, dict(tags)))

    def set(self, value, tags):
        self.log.append((self.name, "set", value, dict(tags)))


def _recorded(log: list) -> WorkerMetrics:
    m = WorkerMetrics("r1")
    for name in (
        "started",
        "finished",
        "failed",
        "tokens",
        "rate_limited",
        "requests_gauge",
        "sandboxes_gauge",
    ):
        setattr(m, name, _Recorder(log, name))
    return m


def test_counts_add_up_and_go_out_once_per_interval(monkeypatch):
    monkeypatch.setattr(metrics_module, "_FLUSH_S", 0.05)
    log: list = []

    async def main():
        m = _recorded(log)
        for _ in range(3):
            m.session_started()
            m.sandbox_opened(+1)
            m.request(+1)
            m.outcome(429, 0, 0)
            m.outcome(200, 100, 7)
        m.session_finished("completed")
        m.session_finished("error:env_start")
        assert log == []  # nothing sent yet
        await asyncio.sleep(0.2)
        sent = list(log)
        m.request(-1)
        m.flush()  # what the worker calls before a batch reports back
        return sent

    sent = asyncio.run(main())
    incs = {(name, tuple(sorted(tags.items()))): amount for name, kind, amount, tags in sent if kind == "inc"}
    assert incs[("started", (("run", "r1"),))] == 3
    assert incs[("tokens", (("kind", "prompt"), ("run", "r1")))] == 300
    assert incs[("tokens", (("kind", "completion"), ("run", "r1")))] == 21
    assert incs[("rate_limited", (("run", "r1"),))] == 3
    assert incs[("finished", (("run", "r1"), ("status", "completed")))] == 1
    assert incs[("finished", (("run", "r1"), ("status", "failed")))] == 1
    assert incs[("failed", (("run", "r1"),))] == 1
    assert ("requests_gauge", "set", 3, {"run": "r1"}) in sent and (
        "sandboxes_gauge",
        "set",
        3,
        {"run": "r1"},
    ) in sent
    assert len(sent) == 9  # one call per series, not one per event
    assert log[-2:] == [
        ("requests_gauge", "set", 2, {"run": "r1"}),
        ("sandboxes_gauge", "set", 3, {"run": "r1"}),
    ]


def test_without_a_running_loop_counts_go_out_at_once():
    log: list = []
    m = _recorded(log)
    m.session_started()
    assert log[0] == ("started", "inc", 1, {"run": "r1"})
