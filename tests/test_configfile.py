"""YAML + flags -> RunConfig."""

from __future__ import annotations

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
