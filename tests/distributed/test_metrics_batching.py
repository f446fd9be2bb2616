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


def test_a_non_ascii_run_name_reaches_ray_as_an_ascii_tag():
    # issue 28 case 1: `--run-name ü40` is a fine folder name, but Ray metric tags must be ASCII: every
    # flush raised UnicodeEncodeError inside the session actors, whose samples were sent to the model again.
    # The real Ray metric objects, no cluster: they check the tags the same way.
    m = WorkerMetrics("ü40-日本")
    m.session_started()
    m.session_finished("completed")
    m.outcome(429, 10, 3)
    m.flush()
    assert m._tags == {"run": "%C3%BC40-%E6%97%A5%E6%9C%AC"}  # percent-escaped, readable and reversible
    assert WorkerMetrics("plain run.1")._tags == {"run": "plain run.1"}  # ASCII names stay as they are


def test_a_metric_that_raises_never_reaches_the_session(caplog):
    class Broken(_Recorder):
        def inc(self, amount, tags):
            raise RuntimeError("metrics backend gone")

    log: list = []
    m = _recorded(log)
    m.started = Broken(log, "started")
    for _ in range(2):
        m.session_started()  # no loop: flushed at once, twice
    assert [r.message for r in caplog.records] == [
        "raygen metrics not exported: RuntimeError: metrics backend gone"
    ]
