"""Unsafe-action labels: every tool call is checked against a versioned rule set (``rules_v1.yaml``)."""

from raygen.safety.rules import (
    Rule,
    RuleSet,
    default_rules,
    label_tool_call,
    load_rules,
    rules_version,
)

__all__ = ["Rule", "RuleSet", "default_rules", "label_tool_call", "load_rules", "rules_version"]
