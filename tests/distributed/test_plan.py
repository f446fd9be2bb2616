"""WorkerPlan: what a session actor derives from the run's config."""

from __future__ import annotations

from raygen.config import RunConfig
from raygen.distributed.plan import WorkerPlan


def plan(**sections) -> WorkerPlan:
    return WorkerPlan(config=RunConfig.model_validate(sections), run_name="r", base_url=None)


def test_connections_follow_the_session_slots_unless_set():
    assert plan(ray={"sessions_per_worker": 300}).model_config().max_connections == 300
    explicit = plan(ray={"sessions_per_worker": 300}, model={"type": "sim", "max_connections": 40})
    assert explicit.model_config().max_connections == 40
    scripted = plan(model={"type": "scripted"})
    assert scripted.model_config() is scripted.config.model
