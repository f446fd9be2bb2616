"""The tool registry: built-in toolsets plus plugin toolsets loaded from ``package.module:attribute``.

A plugin attribute may be a Toolset, a list of Toolsets, or a zero-argument callable returning either.
Toolset names and tool names must be unique across the registry (a tool name is what the model calls).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

from raygen.errors import ConfigError
from raygen.tools.base import Tool, Toolset
from raygen.tools.files import file_toolset
from raygen.tools.terminal import terminal_toolset


def builtin_toolsets() -> list[Toolset]:
    """The toolsets every registry starts with: ``terminal`` and ``file``."""
    return [terminal_toolset(), file_toolset()]


class ToolRegistry:
    """Toolsets by name, and their tools by name."""

    def __init__(self, toolsets: Iterable[Toolset] = ()):
        self.toolsets: dict[str, Toolset] = {}
        self._tools: dict[str, Tool] = {}
        for toolset in toolsets:
            self.add(toolset)

    def add(self, toolset: Toolset, origin: str = "") -> None:
        """Register a toolset; ConfigError on a malformed toolset or a duplicate toolset or tool name."""
        where = f" (from plugin {origin!r})" if origin else ""
        if not isinstance(toolset, Toolset) or not toolset.name:
            raise ConfigError(f"not a named Toolset{where}: {toolset!r}")
        if toolset.name in self.toolsets:
            raise ConfigError(f"toolset {toolset.name!r}{where} is already registered")
        names = [tool.name for tool in toolset.tools if isinstance(tool, Tool)]
        if len(names) != len(toolset.tools) or not all(names):
            raise ConfigError(f"toolset {toolset.name!r}{where} holds something that is not a named Tool")
        for name in names:
            if name in self._tools or names.count(name) > 1:
                raise ConfigError(f"tool {name!r} of toolset {toolset.name!r}{where} is defined twice")
        self.toolsets[toolset.name] = toolset
        self._tools.update(zip(names, toolset.tools, strict=True))

    def toolset_names(self) -> list[str]:
        """Registered toolset names, sorted."""
        return sorted(self.toolsets)

    def all_tool_names(self) -> list[str]:
        """Every registered tool name, sorted."""
        return sorted(self._tools)

    def tools_for(self, toolset_names: Iterable[str]) -> list[Tool]:
        """The tools of these toolsets, in the given toolset order, each tool once."""
        tools: dict[str, Tool] = {}
        for name in toolset_names:
            toolset = self.toolsets.get(name)
            if toolset is None:
                known = ", ".join(self.toolset_names())
                raise ConfigError(f"unknown toolset {name!r}; registered toolsets: {known}")
            for tool in toolset.tools:
                tools.setdefault(tool.name, tool)
        return list(tools.values())

    def get(self, tool_name: str) -> Tool | None:
        """The tool called ``tool_name``, or None."""
        return self._tools.get(tool_name)


def _resolve_plugin(plugin: str) -> list[Toolset]:
    module_name, sep, attribute = plugin.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(f"tool plugin {plugin!r} is not of the form package.module:attribute")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # a plugin's import can fail in any way; all of them are config problems
        raise ConfigError(f"tool plugin {plugin!r}: cannot import {module_name!r}: {exc!r}") from exc
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"tool plugin {plugin!r}: {module_name!r} has no attribute {attribute!r}")
        obj = getattr(obj, part)
    if callable(obj) and not isinstance(obj, Toolset):
        try:
            obj = obj()
        except Exception as exc:
            raise ConfigError(f"tool plugin {plugin!r}: calling {attribute!r} failed: {exc!r}") from exc
    toolsets = list(obj) if isinstance(obj, list | tuple) else [obj]
    if not toolsets or not all(isinstance(toolset, Toolset) for toolset in toolsets):
        raise ConfigError(
            f"tool plugin {plugin!r} must be a Toolset, a list of Toolsets or a zero-argument callable "
            f"returning one; got {type(obj).__name__}"
        )
    return toolsets


def load_registry(plugins: Iterable[str] = ()) -> ToolRegistry:
    """The built-in toolsets plus every plugin's; ConfigError (naming the plugin) if one is unusable."""
    registry = ToolRegistry(builtin_toolsets())
    for plugin in plugins:
        for toolset in _resolve_plugin(plugin):
            registry.add(toolset, origin=plugin)
    return registry
