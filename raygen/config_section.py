"""The base of every configuration section (``raygen.config`` and the backends' config modules)."""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    # Unknown keys in a config file are almost always typos; refuse them instead of ignoring them.
    # NaN and infinities too: JSON has no such values (a NaN temperature reached manifest.json as a bare
    # ``NaN`` and every request failed as if the provider were at fault, issue 28).
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)


def refuse_non_finite(value: Any, where: str = "") -> Any:
    """``value`` (free-form YAML: dicts, lists, scalars) unchanged, or ValueError naming the first float
    inside it that is NaN or infinite (``reasoning.budget``)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where or 'the value'} is {value}: it must be a finite number")
    if isinstance(value, dict):
        for key, item in value.items():
            refuse_non_finite(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            refuse_non_finite(item, f"{where}[{index}]")
    return value
