"""The versioned unsafe-action rule set and the check of one tool call against it.

The check is pure and cheap (a few dozen precompiled regular expressions over a call's string
arguments), so the session loop runs it on every tool call as the call is made. Rules live in
``rules_v<N>.yaml`` next to this module; ``default_rules()`` is the newest version, loaded once per
process.
"""

from __future__ import annotations

import re
from functools import cache, cached_property
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from raygen.errors import ConfigError
from raygen.formats.prefilter import Prefilter
from raygen.formats.records import SafetyLabel

DEFAULT_RULES_FILE = "rules_v1.yaml"
MAX_CHECKED_CHARS = 20_000
"""Only the first this-many characters of each argument are searched, which bounds the cost of a call
whose argument is a huge file body; rules look for commands and paths, which come early."""
ANY_TOOL = "*"
_MACRO = re.compile(r"\{\{(\w+)\}\}")
"""Patterns that keep their meaning only as whole expressions: numbered back-references, named ones,
a leading global flag."""


class RuleExamples(BaseModel):
    """Calls that must (``match``) and must not (``no_match``) trigger a rule; checked by the tests."""

    model_config = ConfigDict(extra="forbid")

    match: list[str | dict[str, str]] = Field(default_factory=list)
    no_match: list[str | dict[str, str]] = Field(default_factory=list)


class Rule(BaseModel):
    """One rule: if ``tool`` is in ``tools`` and any of ``patterns`` is found in one of the call's
    ``args`` (and no ``unless`` pattern is found in that same argument), the call gets ``label``."""

    model_config = ConfigDict(extra="forbid")

    id: str
    label: str
    description: str
    tools: list[str] = Field(min_length=1)
    args: list[str] = Field(min_length=1)
    patterns: list[str] = Field(min_length=1)
    unless: list[str] = Field(default_factory=list)
    examples: RuleExamples = Field(default_factory=RuleExamples)

    _patterns: list[re.Pattern[str]] = PrivateAttr(default_factory=list)
    _unless: list[re.Pattern[str]] = PrivateAttr(default_factory=list)

    @model_validator(mode="after")
    def _compile(self) -> Rule:
        try:
            self._patterns = [re.compile(p) for p in self.patterns]
            self._unless = [re.compile(p) for p in self.unless]
        except re.error as exc:
            raise ValueError(f"rule {self.id}: bad pattern {exc.pattern!r}: {exc}") from exc
        return self

    def applies_to(self, tool: str) -> bool:
        return ANY_TOOL in self.tools or tool in self.tools

    def matches(self, tool: str, args: dict[str, Any]) -> bool:
        """Whether this call triggers the rule."""
        if not self.applies_to(tool):
            return False
        for name in self.args:
            value = args.get(name)
            if not isinstance(value, str) or not value:
                continue
            text = value[:MAX_CHECKED_CHARS]
            if any(p.search(text) for p in self._patterns) and not any(u.search(text) for u in self._unless):
                return True
        return False


class RuleSet(BaseModel):
    """A versioned list of rules (one YAML file)."""

    model_config = ConfigDict(extra="forbid")

    version: str
    description: str = ""
    macros: dict[str, str] = Field(default_factory=dict)
    """``{{name}}`` in a rule's patterns stands for ``macros[name]`` (shared pattern pieces)."""
    labels: dict[str, str]
    """Label name -> what it means."""
    rules: list[Rule]

    @model_validator(mode="before")
    @classmethod
    def _expand_macros(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
            return data
        macros = data.get("macros") or {}

        def expand(pattern: Any) -> Any:
            if not isinstance(pattern, str):
                return pattern
            for name in _MACRO.findall(pattern):
                if name not in macros:
                    raise ValueError(f"pattern {pattern!r} uses unknown macro {{{{{name}}}}}")
            return _MACRO.sub(lambda m: macros[m.group(1)], pattern)

        rules = []
        for rule in data["rules"]:
            if isinstance(rule, dict):
                rule = dict(rule)
                for key in ("patterns", "unless"):
                    if isinstance(rule.get(key), list):
                        rule[key] = [expand(p) for p in rule[key]]
            rules.append(rule)
        return {**data, "rules": rules}

    @model_validator(mode="after")
    def _consistent(self) -> RuleSet:
        seen: set[str] = set()
        for rule in self.rules:
            if rule.id in seen:
                raise ValueError(f"duplicate rule id {rule.id!r}")
            seen.add(rule.id)
            if rule.label not in self.labels:
                known = ", ".join(sorted(self.labels))
                raise ValueError(f"rule {rule.id}: unknown label {rule.label!r} (known: {known})")
        return self

    def check(self, tool: str, args: dict[str, Any]) -> list[Rule]:
        """The rules a call triggers, in rule-set order."""
        # Nearly every call triggers nothing: one search per argument proves that first, so the
        # per-rule walk (~65 µs a call in Python, more than encoding a short request) runs only
        # for calls that might match.
        if not self._might_match(tool, args):
            return []
        return [rule for rule in self.rules if rule.matches(tool, args)]

    @cached_property
    def _screens(self) -> dict[str, list[tuple[str, Prefilter]]]:
        """Per tool name, built on first use (a cached property: a private attribute of a pydantic
        model costs ~1.5 µs a read)."""
        return {}

    def _might_match(self, tool: str, args: dict[str, Any]) -> bool:
        """False only if no pattern of any rule for ``tool`` is found in its arguments (``unless``
        patterns can only cancel a match, so they are left to the exact check)."""
        screens = self._screens.get(tool)
        if screens is None:
            screens = self._screens[tool] = self._screens_for(tool)
        for name, screen in screens:
            value = args.get(name)
            if isinstance(value, str) and value and screen.might_match(value[:MAX_CHECKED_CHARS]):
                return True
        return False

    def _screens_for(self, tool: str) -> list[tuple[str, Prefilter]]:
        """Per argument name: every pattern of the rules for ``tool`` that search it, as one linear-time
        gate (``raygen.formats.prefilter``: ~10x faster than trying Python alternations at every
        position, which was most of the pre-launch scan of a prompts file)."""
        by_arg: dict[str, list[str]] = {}
        for rule in self.rules:
            if rule.applies_to(tool):
                for name in rule.args:
                    by_arg.setdefault(name, []).extend(rule.patterns)
        return [(name, Prefilter(sources)) for name, sources in by_arg.items()]

    def label_call(self, tool: str, args: dict[str, Any], turn: int) -> list[SafetyLabel]:
        """One ``SafetyLabel`` per rule the call triggers (usually none)."""
        return [
            SafetyLabel(turn=turn, tool=tool, label=rule.label, rule_id=rule.id)
            for rule in self.check(tool, args)
        ]


def load_rules(path: str | Path | None = None) -> RuleSet:
    """Load a rule set from a YAML file; the packaged default when ``path`` is None."""
    if path is None:
        text = resources.files("raygen.safety").joinpath(DEFAULT_RULES_FILE).read_text(encoding="utf-8")
        where = f"raygen/safety/{DEFAULT_RULES_FILE}"
    else:
        text = Path(path).read_text(encoding="utf-8")
        where = str(path)
    try:
        # version may be written as a number; it is compared and stored as text.
        data = yaml.safe_load(text)
        if isinstance(data, dict) and "version" in data:
            data["version"] = str(data["version"])
        return RuleSet.model_validate(data)
    except (yaml.YAMLError, ValidationError) as exc:
        raise ConfigError(f"invalid safety rule set {where}: {exc}") from exc


@cache
def default_rules() -> RuleSet:
    """The packaged rule set, loaded once per process."""
    return load_rules()


def label_tool_call(tool: str, args: dict[str, Any], turn: int) -> list[SafetyLabel]:
    """Labels of one tool call under the default rule set (what the session loop calls)."""
    return default_rules().label_call(tool, args, turn)


def rules_version() -> str:
    """Version of the default rule set (recorded with every trajectory)."""
    return default_rules().version
