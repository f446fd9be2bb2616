"""An example tool plugin (``example_plugin:calculator``) used by the registry tests.

Also the shape a user plugin takes: a Toolset of Tool subclasses, importable as ``module:attribute``.
"""

from __future__ import annotations

import ast
import operator
from typing import Any

from raygen.tools.base import Tool, ToolContext, ToolResult, Toolset, check_arguments
from raygen.tools.terminal import TerminalTool

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand)
    raise ValueError("only numbers and + - * / are allowed")


class CalculateTool(Tool):
    """``calculate(expression)`` -> ``{"value"}``."""

    name = "calculate"
    description = "Evaluate an arithmetic expression with + - * / and parentheses."
    parameters = {
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        problem = check_arguments(self.parameters, args)
        if problem:
            return ToolResult.error(problem, kind="invalid_arguments")
        try:
            value = _evaluate(ast.parse(args["expression"], mode="eval").body)
        except (SyntaxError, ValueError, ZeroDivisionError) as exc:
            return ToolResult.error(str(exc))
        return ToolResult.json({"value": value})


calculator = Toolset(name="calculator", tools=[CalculateTool()], description="Arithmetic.")


def make_toolsets() -> list[Toolset]:
    """A zero-argument factory returning several toolsets."""
    return [Toolset(name="calc_a", tools=[]), Toolset(name="calc_b", tools=[])]


not_a_toolset = 42
clashing_toolset = Toolset(name="terminal", tools=[])
clashing_tool = Toolset(name="shell2", tools=[TerminalTool()])


def broken_factory() -> Toolset:
    raise RuntimeError("factory failed")
