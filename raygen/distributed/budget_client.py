"""A session actor's side of the run's budget (``raygen.distributed.budget``): the ``BudgetGate`` its
sessions reserve from before each model call and settle with after it.

A reservation is one round trip to the budget actor (2.2 ms a call, measured one caller at a time on the
shared 2-core machine at load 20), paid only by runs with ``--max-cost`` or ``--max-tokens``; a settlement is
sent without waiting for the answer.
"""

from __future__ import annotations

import logging
from typing import Any

import ray

from raygen.distributed.budget import NAMESPACE, budget_name
from raygen.errors import SessionFailure

log = logging.getLogger(__name__)


class BudgetClient:
    def __init__(self, run_name: str):
        self.name = budget_name(run_name)
        self._actor: Any = None

    def _budget(self) -> Any:
        if self._actor is None:
            self._actor = ray.get_actor(self.name, namespace=NAMESPACE)
        return self._actor

    async def reserve(self, usd: float, tokens: int, session: str | None = None) -> int:
        try:
            ticket = await self._budget().reserve.remote(usd, tokens, session)
        except (ValueError, ray.exceptions.RayActorError) as exc:  # gone: never admit past a lost count
            raise SessionFailure("budget_reached", f"the run's budget actor is gone: {exc}") from None
        if ticket is None:
            raise SessionFailure("budget_reached", "the run's budget is reached; no model call starts")
        return ticket

    def settle(self, ticket: Any, usd: float, tokens: int) -> None:
        self._send("settle", ticket, usd, tokens)

    def end_session(self, session: str) -> None:
        self._send("end_session", session)

    def _send(self, method: str, *args: Any) -> None:
        """A call whose answer nobody waits for."""
        try:
            getattr(self._budget(), method).remote(*args)
        except (ValueError, ray.exceptions.RayActorError) as exc:
            log.warning("could not tell the run's budget (%s): %s", method, exc)
