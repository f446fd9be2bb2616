"""What a session is offered: its tools, their schemas, and the ShareGPT system turn's tools block."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raygen.formats.sharegpt import tools_block
from raygen.tools.base import Tool

OFFERS_KEPT = 256
"""Distinct sets of offered toolsets whose tools and schemas a runner keeps (rows name their toolsets,
so a dataset could name many combinations; past this they are built per session, as before)."""


@dataclass(frozen=True)
class Offer:
    """What a session with these toolsets is offered, built once per runner and shared read-only by its
    sessions: the tool objects are stateless and their schemas never change."""

    tools: list[Tool]
    offered: dict[str, Tool]
    schemas: list[dict[str, Any]]
    tools_block: str
    """The schemas as the ShareGPT system turn shows them."""

    @classmethod
    def of(cls, tools: list[Tool]) -> Offer:
        schemas = [t.schema() for t in tools]
        return cls(tools, {t.name: t for t in tools}, schemas, tools_block(schemas))
