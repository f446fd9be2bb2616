"""The session actor: a Ray Data ``map_batches`` callable class running many sessions on one event loop.

Each batch's rows run concurrently, bounded by one semaphore per actor (``sessions_per_worker``), so a
batch waiting for a slot holds no environment and no connection. Each session's record leaves the actor
the moment the session ends, through the run's control actor (``control.py``) to the driver, which
writes the shards (so no shared filesystem is needed); the actor keeps nothing of a finished session.
Ray Data's own output is one small row per batch (sessions run and skipped), which only tells the
driver that the batch is over.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import ray
from ray.actor import ActorHandle

from raygen.distributed.budget_client import BudgetClient
from raygen.distributed.control_link import ControlLink
from raygen.distributed.governor import gate_for
from raygen.distributed.metrics import MeteredGate, WorkerMetrics
from raygen.distributed.plan import WorkerPlan
from raygen.distributed.sandbox_governor import sandbox_gate_for, sandbox_key
from raygen.envs.processes import use_pidfd_child_watcher
from raygen.input.rows import Sample
from raygen.model import create_model
from raygen.model.pricing import CostPolicy, ModelPricing, reserve_completion_tokens
from raygen.output.shards import jsonl_safe
from raygen.output.summary import summarize
from raygen.session.agent import SessionRunner
from raygen.tools.mcp_session import McpSettings
from raygen.tools.mcp_tools import mcp_toolset
from raygen.tools.registry import load_registry


class SessionWorker:
    def __init__(self, plan: WorkerPlan, control: ActorHandle):
        self.control = ControlLink(control)
        cfg = plan.config
        self.node = ray.get_runtime_context().get_node_id()
        api_key = plan.api_key.get_secret_value()
        self.metrics = WorkerMetrics(plan.run_name)
        governor = cfg.governor.bounded(getattr(cfg.model, "retry_max_wait_s", None))
        # One gate per process, leasing capacity from the cluster-wide governor the driver created.
        gate = MeteredGate(gate_for(governor, plan.base_url, cfg.model.model, api_key), self.metrics)
        self.model = create_model(
            plan.model_config(),
            sampling=cfg.sampling,
            sim=cfg.sim,
            base_url=plan.base_url,
            api_key=api_key,
            gate=gate,
            provider=cfg.provider,
        )
        secrets = [s.get_secret_value() for s in plan.secret_values]
        if api_key:
            secrets.append(api_key)
        registry = load_registry(cfg.tools.plugins)
        for listing in plan.mcp_servers:
            registry.add(mcp_toolset(listing), origin=f"MCP server {listing.name}")
        self.runner = SessionRunner(
            model=self.model,
            registry=registry,
            mcp=McpSettings.of(cfg.tools, plan.mcp_servers, plan.mcp_env),
            env_config=cfg.env,
            session=cfg.session,
            run_name=plan.run_name,
            node=self.node,
            config_fingerprint=plan.config_fingerprint,
            secret_values=secrets,
            verify_default=cfg.verify.default,
            on_sandbox=self.metrics.sandbox_opened,
            cost=CostPolicy(
                ModelPricing.resolve(self.model.name, cfg.pricing),
                gate=BudgetClient(plan.run_name) if cfg.budget.limits_anything() else None,
                session_cap_usd=cfg.budget.max_session_cost_usd,
                reserve_completion_tokens=reserve_completion_tokens(cfg.budget, cfg.sampling),
            ),
            agent=cfg.agent,
            sandbox_gate=sandbox_gate_for(cfg.env),
            sandbox_key=sandbox_key(cfg.env, self.node),
        )
        self.slots = asyncio.Semaphore(cfg.ray.sessions_per_worker)
        self.pid = os.getpid()
        # Everything alive now (Ray, Ray Data, pyarrow, the SDK, pydantic: ~10^6 objects) lives as long
        # as the actor. Frozen, the collector stops walking it: each full collection had paused this
        # event loop, and every session on it, for 60-200 ms (measured), about every 5 s.
        gc.collect()  # what is garbage now could never be collected once frozen
        gc.freeze()

    async def _one(self, text: str, handed_over: list[asyncio.Future[None]]) -> bool:
        """Run one sample unless the control actor says not to (it finished already, or the run is
        draining); returns whether it ran. The record's hand-over goes to ``handed_over``: the slot is
        free as soon as the session ends, the batch waits for the hand-over."""
        sample = Sample.model_validate_json(text)
        key = (sample.sample_key, sample.attempt)
        # Draining is for good: once the control actor said so, the rest of this actor's samples skip
        # without asking, so Ray Data's iteration ends soon after the sessions in flight.
        if self.control.draining:
            return False
        # Asked before a slot is free, so that a freed slot starts its next session at once instead of
        # a round trip later (a few percent of every session's time).
        if await self.control.begin(*key) != "run":
            return False
        try:
            await self.slots.acquire()
        except BaseException:  # cancelled while waiting (Ray Data cancels a failed task's other batches)
            self.control.release(*key)
            raise
        try:
            if self.control.draining:  # came while this sample waited for a slot
                self.control.release(*key)
                return False
            self.control.started()
            self.metrics.session_started()
            # Cancelled mid-session (raises only then), the key stays "running": a drain then waits for the
            # task's re-run or its timeout rather than ending while the session's request may be served.
            record = await self.runner.run(sample)
            self.metrics.session_finished(record.exit_status, record.cost_usd)
            summary = json.dumps(dataclasses.asdict(summarize(record)))
            handed_over.append(self.control.finish(*key, jsonl_safe(record.model_dump_json()), summary))
        finally:
            self.slots.release()
        return True

    async def __call__(self, batch: dict[str, Any]) -> AsyncIterator[dict[str, list[int]]]:
        use_pidfd_child_watcher()  # this loop starts every command of this actor's sessions
        handed_over: list[asyncio.Future[None]] = []
        ran = await asyncio.gather(*(self._one(str(t), handed_over) for t in batch["text"]))
        await asyncio.gather(*handed_over)
        self.metrics.flush()  # the actor may be stopped once Ray Data has seen its last batch end
        yield {"ran": [sum(ran)], "skipped": [len(ran) - sum(ran)]}
