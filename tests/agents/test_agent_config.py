"""The ``agent:`` section: flags, ``-c`` settings, defaults, where harnesses can run, the fingerprint."""

from __future__ import annotations

import pytest

from raygen.config import CommandAgentConfig, HermesAgentConfig, MiniSweAgentConfig
from raygen.configfile import load_config
from raygen.envs import environment_class
from raygen.errors import ConfigError
from raygen.run.generation import Generation


def test_builtin_is_the_default_and_a_command_alone_means_type_command():
    assert load_config(None).agent.type == "builtin"
    config = load_config(["agent.command=my-agent --task {prompt}"])
    assert isinstance(config.agent, CommandAgentConfig) and config.agent.command == "my-agent --task {prompt}"


def test_the_flags_choose_a_preset_or_a_command():
    hermes = load_config(["agent.executable=/opt/hermes/bin/hermes"], {"agent": {"type": "hermes"}})
    assert isinstance(hermes.agent, HermesAgentConfig) and hermes.agent.executable == "/opt/hermes/bin/hermes"
    mini = load_config(None, {"agent": {"type": "mini-swe-agent"}})
    assert isinstance(mini.agent, MiniSweAgentConfig) and mini.agent.executable == "mini"
    command = load_config(None, {"agent": {"command": "true"}})
    assert command.agent.type == "command"


def test_a_preset_takes_no_command_and_a_command_needs_one():
    with pytest.raises(ConfigError, match="command"):
        load_config(["agent.type=hermes", "agent.command=x"])
    with pytest.raises(ConfigError, match="command"):
        load_config(["agent.type=command"])


@pytest.mark.parametrize("backend", ["fake", "modal", "singularity"])
def test_harnesses_run_only_where_the_proxy_can_be_bound_in(backend):
    with pytest.raises(ConfigError, match="model proxy"):
        load_config([f"env.type={backend}", "agent.command=echo hi"])


def test_the_harness_backends_are_those_that_bind_host_folders():
    binding = {name for name in ("local", "fake", "docker", "modal", "singularity")
               if environment_class(name).supports_binds}  # fmt: skip
    assert binding == {"local", "docker"}  # as docs/agents.md and docs/backends.md say
    for backend in binding:
        assert load_config([f"env.type={backend}", "agent.command=echo hi"]).agent.type == "command"
    assert load_config(["env.type=docker", "agent.type=hermes"]).agent.type == "hermes"


def test_the_agent_is_part_of_the_generation_fingerprint():
    builtin = Generation.build(load_config(None))
    assert "agent" not in builtin.settings  # runs of raygen's own loop keep their fingerprint
    hermes = Generation.build(load_config(None, {"agent": {"type": "hermes"}}))
    mini = Generation.build(load_config(None, {"agent": {"type": "mini-swe-agent"}}))
    assert len({builtin.fingerprint, hermes.fingerprint, mini.fingerprint}) == 3
    assert hermes.settings["agent"]["type"] == "hermes"
