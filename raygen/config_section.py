"""The base of every configuration section (``raygen.config`` and the backends' config modules)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    # Unknown keys in a config file are almost always typos; refuse them instead of ignoring them.
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)
