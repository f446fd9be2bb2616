"""YAML + flags -> RunConfig."""

from __future__ import annotations

import re

import pytest

from raygen.configfile import deep_merge, load_config
from raygen.errors import ConfigError


def test_flags_override_file_key_by_key(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model: {base_url: 'http://x/v1', model: m1}\nsession: {max_turns: 4}\n")
    cfg = load_config(path, {"model": {"model": "m2"}, "ray": {"workers": 3}})
    assert cfg.model.type == "openai" and cfg.model.base_url == "http://x/v1" and cfg.model.model == "m2"
    assert cfg.session.max_turns == 4 and cfg.ray.workers == 3


def test_switching_backend_type_replaces_the_section():
    merged = deep_merge({"env": {"type": "local", "bwrap": True}}, {"env": {"type": "docker"}})
    assert merged["env"] == {"type": "docker"}
    cfg = load_config(None, merged)
    assert cfg.env.type == "docker"


def test_unknown_keys_and_bad_values_are_reported_with_their_path(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("sesion: {max_turns: 3}\nsession: {max_turns: 0}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = str(info.value)
    assert str(path) in text and "sesion" in text and "session.max_turns" in text


def test_invalid_yaml_and_non_mapping(tmp_path):
    bad = tmp_path / "x.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(bad)
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")


def test_overrides_are_applied_in_order_with_yaml_values(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("ray: {workers: 4}\nsampling: {temperature: 0.2}\n")
    cfg = load_config(
        [path, "ray.workers=6", "sampling.extra_body={reasoning: {effort: high}}", "ray.workers=7"],
        {"session": {"max_turns": 2}},
    )
    assert cfg.ray.workers == 7 and cfg.sampling.temperature == 0.2 and cfg.session.max_turns == 2
    assert cfg.sampling.extra_body == {"reasoning": {"effort": "high"}}
    # A field that wants text gets the value as typed, even where YAML reads a number.
    assert load_config(["output.run_name=2024", "model.model=1.5"]).output.run_name == "2024"
    # The named flags (overrides) win over -c.
    assert load_config(["ray.workers=9"], {"ray": {"workers": 3}}).ray.workers == 3


def test_errors_name_the_source_and_the_key(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("ray:\n  workers: 4\n  wrokers: 2\nmodel:\n  type: scripted\n  base_url: http://x/v1\n")
    with pytest.raises(ConfigError) as info:
        load_config([path, "session.max_turns=zero", "env.type=nope"])
    lines = str(info.value).splitlines()
    assert f"  {path}:3: ray.wrokers: Extra inputs are not permitted" in lines
    assert (
        f"  {path}:6: model.base_url: Extra inputs are not permitted (an option of model.type openai)"
        in lines
    )
    assert any(line.startswith("  -c session.max_turns=zero: session.max_turns: ") for line in lines)
    assert any(line.startswith("  -c env.type=nope: env: Input tag 'nope'") for line in lines)


def test_bad_override_syntax_and_values():
    with pytest.raises(ConfigError, match=r"-c ray.workers=\[1: ray.workers: the value is not valid YAML"):
        load_config(["ray.workers=[1"])
    with pytest.raises(ConfigError, match=r"cannot read config ray\.workers"):
        load_config(["ray.workers"])  # no '=': a file name, and there is no such file
    with pytest.raises(ConfigError, match=r"-c nope.key=1: nope: Extra inputs are not permitted"):
        load_config(["nope.key=1"])


def test_a_model_without_endpoint_is_the_simulator(tmp_path):
    from raygen.config import RunConfig

    assert RunConfig().model.type == "sim"
    assert load_config(None).model.type == "sim"
    # A model section without type: the simulator unless it names an endpoint.
    assert load_config(None, {"model": {"model": "m", "timeout_s": 5}}).model.type == "sim"
    assert load_config(None, {"model": {"base_url": "http://x/v1"}}).model.type == "openai"
    path = tmp_path / "run.yaml"
    path.write_text("ray: {workers: 2}\nmodel:\n  type: openai\n  model: m\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"  {path}:2: model.base_url: Field required" in str(info.value).splitlines()
    # An endpoint given on the command line turns a file's model section into an openai one.
    assert load_config(path, {"model": {"base_url": "http://x/v1"}}).model.model == "m"


def test_manifests_of_runs_made_before_model_type_sim_read_as_sim():
    from raygen.configfile import run_config_from_manifest

    legacy = {"model": {"type": "openai", "base_url": None, "model": "raygen-sim", "api_key_env": "K"}}
    model = run_config_from_manifest(legacy).model
    assert model.type == "sim" and model.model == "raygen-sim"
    real = {"model": {"type": "openai", "base_url": "http://x/v1", "model": "m", "api_key_env": "K"}}
    assert run_config_from_manifest(real).model.type == "openai"


def test_an_option_of_another_backend_says_which_backend_has_it():
    with pytest.raises(ConfigError) as info:
        load_config(["model.api_key_env=MY_KEY"])  # no endpoint: the simulator, which needs no key
    assert "model.api_key_env: Extra inputs are not permitted (an option of model.type openai)" in str(
        info.value
    )
    with pytest.raises(ConfigError) as info:
        load_config(["env.type=local", "env.pull=never"])
    assert "(an option of env.type docker or singularity)" in str(info.value)


def test_nan_and_infinities_are_refused_in_files_and_overrides(tmp_path):
    # issue 28 case 2: a NaN temperature was accepted, written as bare NaN to manifest.json, and every
    # call failed as the provider's fault. Every float of the config refuses NaN and infinities.
    path = tmp_path / "run.yaml"
    path.write_text("sampling:\n  temperature: .nan\ngovernor:\n  rpm: .inf\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    lines = str(info.value).splitlines()
    assert any(line.startswith(f"  {path}:2: sampling.temperature: ") for line in lines), lines
    assert any(line.startswith(f"  {path}:4: governor.rpm: ") for line in lines), lines
    for override in (
        "sampling.temperature=.nan",
        "sampling.temperature=-.inf",
        "session.command_timeout_s=.inf",
    ):
        with pytest.raises(
            ConfigError, match=rf"-c {re.escape(override)}: {override.split('=')[0]}: .*finite"
        ):
            load_config([override])
    # Inside the free-form request body too: JSON has no NaN, the provider would get a broken body.
    with pytest.raises(ConfigError, match=r"sampling\.extra_body: .*reasoning\.budget.*finite"):
        load_config(["sampling.extra_body={reasoning: {budget: .nan}}"])
    assert load_config(["sampling.temperature=0.7"]).sampling.temperature == 0.7
