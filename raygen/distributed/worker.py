"""The session actor: a Ray Data ``map_batches`` callable class running many sessions on one event loop.

Each batch's rows run concurrently, bounded by one semaphore per actor (``sessions_per_worker``), so a
batch waiting for a slot holds no environment and no connection. Results leave the actor through the
object store as two string columns per session: the full record (written to shards by the driver, so
no shared filesystem is needed) and its small summary (for statistics and progress).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from typing import Any

import ray

from raygen.distributed.governor import make_gate
from raygen.distributed.plan import WorkerPlan
from raygen.input.rows import Sample
from raygen.model import create_model
from raygen.output.shards import jsonl_safe
from raygen.output.summary import summarize
from raygen.session.agent import SessionRunner
from raygen.tools.registry import load_registry


class SessionWorker:
    def __init__(self, plan: WorkerPlan):
        cfg = plan.config
        self.node = ray.get_runtime_context().get_node_id()
        api_key = plan.api_key.get_secret_value()
        # One gate per process, leasing capacity from the cluster-wide governor the driver created.
        gate = make_gate(cfg.governor, plan.base_url, cfg.model.model, api_key)
        self.model = create_model(
            plan.model_config(),
            sampling=cfg.sampling,
            sim=cfg.sim,
            base_url=plan.base_url,
            api_key=api_key,
            gate=gate,
        )
        secrets = [s.get_secret_value() for s in plan.secret_values]
        if api_key:
            secrets.append(api_key)
        self.runner = SessionRunner(
            model=self.model,
            registry=load_registry(cfg.tools.plugins),
            env_config=cfg.env,
            session=cfg.session,
            run_name=plan.run_name,
            node=self.node,
            config_fingerprint=plan.config_fingerprint,
            secret_values=secrets,
        )
        self.slots = asyncio.Semaphore(cfg.ray.sessions_per_worker)
        self.pid = os.getpid()

    async def _one(self, text: str) -> tuple[str, str]:
        sample = Sample.model_validate_json(text)
        async with self.slots:
            record = await self.runner.run(sample)
        summary = summarize(record)
        return jsonl_safe(record.model_dump_json()), json.dumps(dataclasses.asdict(summary))

    async def __call__(self, batch: dict[str, Any]):
        results = await asyncio.gather(*(self._one(str(t)) for t in batch["text"]))
        yield {
            "record": [r for r, _ in results],
            "summary": [s for _, s in results],
        }
