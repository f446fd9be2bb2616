"""Toolset distributions: which toolsets each sample is offered.

A distribution gives every toolset an independent probability in percent (0-100); ``"*"`` stands for
every registered toolset not listed by name. Per sample, each toolset is an independent coin flip; if
none came up, the most probable one is enabled (ties: alphabetical), so a session always has a tool.

Each coin is seeded from sha256 of (run seed, sample key, toolset name): the draw is reproducible,
identical on resume, and registering another toolset never changes the draws of the existing ones.

Usage: ``load_distribution(name_or_path, known_toolsets)`` returns a ``BoundDistribution`` whose
``draw(run_seed, sample_key)`` is what ``raygen.input.validate.iter_samples`` calls.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from raygen.errors import ConfigError

WILDCARD = "*"
"""Key meaning "every registered toolset not listed"."""

Percent = Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)]


def _coin(run_seed: int, sample_key: str, toolset: str) -> float:
    """A uniform number in [0, 1) fixed by its inputs (53 bits, so it is never rounded up to 1.0)."""
    digest = hashlib.sha256(f"{run_seed}\x00{sample_key}\x00{toolset}".encode()).digest()
    return (int.from_bytes(digest[:8], "big") >> 11) / float(1 << 53)


class Distribution(BaseModel):
    """A named set of per-toolset probabilities in percent."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    toolsets: dict[str, Percent]
    """Toolset name (or ``"*"``) -> probability in percent that a sample is offered it."""

    def probabilities(self, available: list[str]) -> dict[str, float]:
        """Probability (percent) of each available toolset, ``"*"`` expanded; unlisted ones get 0."""
        fallback = self.toolsets.get(WILDCARD, 0.0)
        return {name: self.toolsets.get(name, fallback) for name in sorted(set(available))}

    def draw(self, run_seed: int, sample_key: str, available: list[str]) -> list[str]:
        """The sorted toolsets offered to one sample, drawn among ``available``."""
        probabilities = self.probabilities(available)
        chosen = [
            name
            for name, percent in probabilities.items()
            if _coin(run_seed, sample_key, name) * 100 < percent
        ]
        if not chosen and probabilities:
            # Most probable first, then alphabetical: min over (-p, name).
            chosen = [min(probabilities, key=lambda name: (-probabilities[name], name))]
        return chosen

    def bind(self, known_toolsets: set[str]) -> BoundDistribution:
        """Check the names against the registered toolsets and fix ``available`` to them."""
        choices = sorted(known_toolsets)
        unknown = sorted(set(self.toolsets) - set(known_toolsets) - {WILDCARD})
        if unknown:
            raise ConfigError(
                f"distribution {self.name!r} names unknown toolset(s) {', '.join(unknown)}; "
                f"registered toolsets: {', '.join(choices) or '(none)'}"
            )
        if choices and not any(self.probabilities(choices).values()):
            raise ConfigError(f"distribution {self.name!r} gives every registered toolset probability 0")
        return BoundDistribution(self, tuple(choices))


@dataclass(frozen=True)
class BoundDistribution:
    """A distribution fixed to the run's registered toolsets: ``draw(run_seed, sample_key)``."""

    distribution: Distribution
    available: tuple[str, ...]
    always: tuple[str, ...] = ()
    """Toolsets added to every draw (the run's MCP servers the distribution does not name)."""

    @property
    def name(self) -> str:
        return self.distribution.name

    def probabilities(self) -> dict[str, float]:
        """Probability (percent) of each registered toolset."""
        drawn = self.distribution.probabilities(list(self.available))
        return dict(sorted({**drawn, **dict.fromkeys(self.always, 100.0)}.items()))

    def draw(self, run_seed: int, sample_key: str) -> list[str]:
        """The sorted toolsets offered to one sample."""
        drawn = self.distribution.draw(run_seed, sample_key, list(self.available))
        return sorted({*drawn, *self.always})


def _parse(name: str, spec: Any, source: str) -> Distribution:
    if not isinstance(spec, dict):
        raise ConfigError(
            f"{source}: a distribution must be a mapping with 'toolsets', got {type(spec).__name__}"
        )
    try:
        return Distribution.model_validate({"name": name, **spec})
    except ValidationError as exc:
        details = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors(include_url=False)
        )
        raise ConfigError(f"{source}: invalid distribution {name!r}: {details}") from None


@cache
def _builtins() -> dict[str, Distribution]:
    text = resources.files("raygen.tools").joinpath("distributions.yaml").read_text(encoding="utf-8")
    return {name: _parse(name, spec, "built-in distributions") for name, spec in yaml.safe_load(text).items()}


def builtin_distributions() -> dict[str, Distribution]:
    """The distributions shipped in ``distributions.yaml``, by name."""
    return dict(_builtins())


def _load_file(path: Path) -> Distribution:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read distribution file {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"distribution file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"distribution file {path} must hold a mapping {{name, description, toolsets}}")
    data = dict(data)
    name = data.pop("name", path.stem)
    return _parse(str(name), data, str(path))


def load_distribution(
    name_or_path: str, known_toolsets: set[str], always: Iterable[str] = ()
) -> BoundDistribution:
    """A built-in distribution by name, or one from a YAML file ``{name, description, toolsets}``,
    checked against and bound to ``known_toolsets``. Raises ``ConfigError`` with the valid choices.
    Toolsets of ``always`` that the distribution does not name are offered to every sample."""
    builtins = _builtins()
    if name_or_path in builtins:
        distribution = builtins[name_or_path]
    else:
        path = Path(name_or_path)
        if not (path.suffix in (".yaml", ".yml") or path.exists() or "/" in name_or_path):
            raise ConfigError(
                f"unknown toolset distribution {name_or_path!r}; built-ins: {', '.join(sorted(builtins))} "
                "(or give the path of a YAML file)"
            )
        distribution = _load_file(path)
    added = tuple(sorted(set(always) - set(distribution.toolsets)))
    bound = distribution.bind(known_toolsets - set(added))
    return BoundDistribution(bound.distribution, bound.available, added)
