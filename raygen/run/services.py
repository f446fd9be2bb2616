"""The services a run's sessions need, started before the first pass and stopped after the last, in
reverse order, however the run ends: this node's leftover containers reaped, the built-in simulator
(when the config names no endpoint), Ray, the cluster-wide governor, and the run's budget (with
``--max-cost`` / ``--max-tokens``).

Ray is imported only inside (through ``raygen.distributed``), so importing the driver stays cheap.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr

from raygen.config import RunConfig
from raygen.distributed.plan import WorkerPlan
from raygen.envs import environment_class
from raygen.run.drain import children_ignore_sigint
from raygen.run.endpoint import model_endpoint
from raygen.run.generation import Generation, RunSecrets
from raygen.run.reporter import RunReporter


@dataclass
class RunServices:
    plan: WorkerPlan
    """What every session actor is built from (endpoint resolved, secrets wrapped)."""
    monitor: Any
    """``GovernorMonitor``: the governor's line for the progress display and its history."""
    generation: Generation
    reporter: RunReporter
    budget: Any = None
    """The run's budget actor (``raygen.distributed.budget``), or None without a budget."""

    @property
    def config(self) -> RunConfig:
        return self.plan.config

    def budget_report(self) -> dict[str, Any] | None:
        """The budget actor's spend, caps and overshoot figures (None without a budget)."""
        if self.budget is None:
            return None
        from raygen.distributed.budget import budget_snapshot

        return budget_snapshot(self.budget)


@contextmanager
def run_services(
    config: RunConfig,
    generation: Generation,
    secrets: RunSecrets,
    reporter: RunReporter,
    spent: tuple[float, int] = (0.0, 0),
) -> Iterator[RunServices]:
    """``spent``: USD and tokens earlier invocations of the run recorded (they count against its budget)."""
    from raygen.distributed.cluster import RAY_DATA_ACTOR_NOTE, ensure_ray, shutdown_ray
    from raygen.distributed.governor import get_or_create_governor
    from raygen.distributed.monitor import GovernorMonitor
    from raygen.distributed.sandbox_governor import get_or_create_sandbox_governor

    with ExitStack() as stack:
        reap(config, reporter)  # containers a killed earlier attempt of this run left behind
        stack.callback(reap, config, reporter)
        with children_ignore_sigint():
            base_url = stack.enter_context(model_endpoint(config, reporter.note))
            if ensure_ray(config.ray.address, metrics_export_port=config.ray.metrics_export_port):
                # Ray's logs are kept when the run ends with an error (they may say why).
                stack.push(lambda error_type, *_: shutdown_ray(keep_logs=error_type is not None))
        reporter.note(RAY_DATA_ACTOR_NOTE)
        # Created by the driver so it lives exactly as long as the run (named: workers find it).
        governor = config.governor.bounded(getattr(config.model, "retry_max_wait_s", None))
        monitor = GovernorMonitor(
            get_or_create_governor(governor, base_url, config.model.model, secrets.api_key)
        )
        # Likewise the sandbox governor, when the backend's fleet has limits (docker, modal, singularity).
        fleet = getattr(config.env, "fleet", None)
        if fleet is not None:
            get_or_create_sandbox_governor(fleet)
        plan = WorkerPlan(
            config=config,
            run_name=str(config.output.run_name),
            base_url=base_url,
            api_key=SecretStr(secrets.api_key),
            config_fingerprint=generation.fingerprint,
            secret_values=[SecretStr(v) for v in secrets.values],
            mcp_servers=generation.mcp_servers,
            mcp_env={name: SecretStr(value) for name, value in secrets.mcp_env.items()},
        )
        budget = None
        if config.budget.limits_anything():
            from raygen.distributed.budget import start_budget

            b, model = config.budget, config.model
            # A call (with its retries) that has not settled after this long has lost its session actor.
            ttl_s = getattr(model, "timeout_s", 600.0) * (getattr(model, "max_retries", 0) + 2)
            budget = start_budget(str(config.output.run_name), b.max_cost_usd, b.max_tokens, spent, ttl_s)
        yield RunServices(plan=plan, monitor=monitor, generation=generation, reporter=reporter, budget=budget)


def reap(config: RunConfig, reporter: RunReporter) -> None:
    """Remove what killed sessions of this run left on this node (the backend's ``reap``; nothing for
    backends whose sessions leave nothing behind)."""
    removed = environment_class(config.env.type).reap(config.env, str(config.output.run_name))
    if removed:
        reporter.note(f"removed {removed} leftover container(s) of run {config.output.run_name}")
