"""ToolRegistry and plugin loading."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from raygen.config import FakeEnvConfig
from raygen.envs.base import EnvSpec
from raygen.envs.fake import FakeEnvironment
from raygen.errors import ConfigError
from raygen.tools.base import ToolContext, Toolset
from raygen.tools.registry import ToolRegistry, builtin_toolsets, load_registry

HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def plugin_path(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(HERE))


def test_builtin_toolsets_and_tools():
    registry = load_registry([])
    assert registry.toolset_names() == ["file", "terminal"]
    assert registry.all_tool_names() == ["patch", "read_file", "search_files", "terminal", "write_file"]
    assert set(registry.toolsets) == {"file", "terminal"}
    assert registry.get("terminal").name == "terminal"
    assert registry.get("nope") is None
    for name in registry.all_tool_names():
        schema = registry.get(name).schema()
        assert schema["function"]["name"] == name
        assert schema["function"]["parameters"]["type"] == "object"
        json.dumps(schema)  # must be sendable as-is


def test_tools_for_keeps_toolset_order_and_deduplicates():
    registry = load_registry([])
    names = [tool.name for tool in registry.tools_for(["terminal", "file", "terminal"])]
    assert names == ["terminal", "read_file", "write_file", "patch", "search_files"]
    assert registry.tools_for([]) == []


def test_tools_for_unknown_toolset_is_a_config_error():
    with pytest.raises(ConfigError, match="web"):
        load_registry([]).tools_for(["web"])


async def test_plugin_toolset_is_registered_and_works():
    registry = load_registry(["example_plugin:calculator"])
    assert registry.toolset_names() == ["calculator", "file", "terminal"]
    tool = registry.get("calculate")
    env = FakeEnvironment(FakeEnvConfig(), EnvSpec(session_key="k"))
    async with env:
        result = await tool.run({"expression": "(1 + 2) * 4"}, ToolContext(env=env))
    assert result.ok and json.loads(result.content) == {"value": 12}


def test_plugin_factory_returning_a_list():
    registry = load_registry(["example_plugin:make_toolsets"])
    assert {"calc_a", "calc_b"} <= set(registry.toolset_names())


@pytest.mark.parametrize(
    ("plugin", "message"),
    [
        ("example_plugin", "package.module:attribute"),
        ("no_such_module_xyz:thing", "cannot import"),
        ("example_plugin:missing", "no attribute"),
        ("example_plugin:not_a_toolset", "must be a Toolset"),
        ("example_plugin:broken_factory", "factory failed"),
        ("example_plugin:clashing_toolset", "toolset 'terminal'"),
        ("example_plugin:clashing_tool", "tool 'terminal'"),
    ],
)
def test_bad_plugins_are_config_errors_naming_the_plugin(plugin: str, message: str):
    with pytest.raises(ConfigError) as error:
        load_registry([plugin])
    assert plugin in str(error.value) and message in str(error.value)
    pickle.loads(pickle.dumps(error.value))  # crosses Ray process boundaries


def test_plugin_whose_import_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "raygen_broken_plugin_mod.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="boom at import"):
        load_registry(["raygen_broken_plugin_mod:anything"])


def test_loading_the_same_plugin_twice_is_a_duplicate():
    with pytest.raises(ConfigError, match="already registered"):
        load_registry(["example_plugin:calculator", "example_plugin:calculator"])


def test_registry_from_explicit_toolsets():
    registry = ToolRegistry(builtin_toolsets()[:1])
    assert registry.toolset_names() == ["terminal"]
    with pytest.raises(ConfigError):
        registry.add(Toolset(name=""))
