"""Config sources -> RunConfig: YAML files and ``key.path=value`` overrides, merged key by key in the
order given (later wins), then the CLI's named flags on top.

Every error names where the bad value came from: ``run.yaml:3: ray.workers: ...`` for a file (the line
of the key), ``-c ray.workers=abc: ray.workers: ...`` for an override.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from raygen.config import RunConfig
from raygen.errors import ConfigError

Source = Path | str
"""A YAML file, or (a string) an override ``key.path=value`` whose value is parsed as YAML."""

_OVERRIDE = re.compile(r"^(?P<key>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)=(?P<value>.*)$", re.DOTALL)


def deep_merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A new dict: ``overrides`` on ``base``, key by key; neither input is modified."""
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict):
            section = out.get(key)
            if not isinstance(section, dict):
                section = {}
            elif "type" in value and section.get("type") not in (None, value["type"]):
                # A different backend type replaces the section instead of mixing two backends' fields.
                section = {}
            out[key] = deep_merge(section, value)
        else:
            out[key] = value
    return out


def set_path(target: dict[str, Any], dotted: str, value: Any) -> None:
    """``set_path(d, "model.base_url", v)`` -> ``d["model"]["base_url"] = v``."""
    *parents, leaf = dotted.split(".")
    for part in parents:
        target = target.setdefault(part, {})
    target[leaf] = value


def is_override(source: Source) -> bool:
    """True for ``key.path=value``; a path such as ``configs/a=b.yaml`` is a file (``/`` is no key)."""
    return isinstance(source, str) and _OVERRIDE.match(source) is not None


@dataclass
class _Layer:
    """One source's settings, and where each of its keys was written (for error messages)."""

    where: str
    data: dict[str, Any]
    lines: dict[str, int] = field(default_factory=dict)
    raw_text: dict[str, str] = field(default_factory=dict)
    """Override values as typed, for a field that wants text where YAML read a number or boolean."""

    def origin(self, key: str) -> str | None:
        """``where[:line]`` if this layer set ``key``, else None."""
        if not _has_path(self.data, key):
            return None
        line = self.lines.get(key)
        return f"{self.where}:{line}" if line else self.where


def _has_path(data: dict[str, Any], dotted: str) -> bool:
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return True


def _file_layer(path: Path) -> _Layer:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    try:
        loaded = yaml.safe_load(text)
        node = yaml.compose(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    lines: dict[str, int] = {}
    _key_lines(node, "", lines)
    return _Layer(str(path), loaded or {}, lines)


def _key_lines(node: Any, prefix: str, lines: dict[str, int]) -> None:
    if not isinstance(node, yaml.MappingNode):
        return
    for key_node, value_node in node.value:
        dotted = f"{prefix}{key_node.value}"
        lines[dotted] = key_node.start_mark.line + 1
        _key_lines(value_node, dotted + ".", lines)


def _override_layer(spec: str) -> _Layer:
    match = _OVERRIDE.match(spec)
    if match is None:
        raise ConfigError(f"-c {spec}: expected key.path=value, e.g. -c sampling.temperature=0.7")
    key, text = match["key"], match["value"]
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        problem = str(exc).splitlines()[0]
        raise ConfigError(f"-c {spec}: {key}: the value is not valid YAML ({problem})") from None
    data: dict[str, Any] = {}
    set_path(data, key, value)
    return _Layer(f"-c {spec}", data, raw_text={key: text} if not isinstance(value, dict | list) else {})


def _layer(source: Source) -> _Layer:
    return _override_layer(source) if is_override(source) else _file_layer(Path(source))


def _default_types(data: dict[str, Any]) -> None:
    """Backend sections are discriminated unions; a section given without ``type`` means the default
    backend: ``local`` for ``env``; for ``model``, ``openai`` if it names an endpoint, else ``sim``; for
    ``agent``, ``command`` if it has a ``command``, else ``builtin``."""
    if isinstance(data.get("env"), dict):
        data["env"].setdefault("type", "local")
    if isinstance(data.get("model"), dict):
        data["model"].setdefault("type", "sim" if data["model"].get("base_url") is None else "openai")
    if isinstance(data.get("agent"), dict):
        data["agent"].setdefault("type", "builtin" if data["agent"].get("command") is None else "command")


def run_config_from_manifest(config: dict[str, Any]) -> RunConfig:
    """The RunConfig a run folder's ``manifest.json`` recorded. Runs made before ``model.type: sim``
    recorded the simulator as ``openai`` without ``base_url``; they are read as ``sim``."""
    model = config.get("model")
    if isinstance(model, dict) and model.get("type") == "openai" and model.get("base_url") is None:
        legacy = {k: v for k, v in model.items() if k not in ("base_url", "api_key_env")}
        config = {**config, "model": {**legacy, "type": "sim"}}
    return RunConfig.model_validate(config)


def load_config(
    sources: Source | Sequence[Source] | None, overrides: dict[str, Any] | None = None
) -> RunConfig:
    """The RunConfig of ``sources`` (files and ``key.path=value`` overrides, in order), with ``overrides``
    (nested dict, e.g. from named CLI flags) applied last."""
    if sources is None:
        sources = []
    elif isinstance(sources, Path | str):
        sources = [sources]
    layers = [_layer(source) for source in sources]
    if overrides:
        layers.append(_Layer("", overrides))
    for _ in range(2):  # a second try only with override values taken as text (see _retry_as_text)
        data: dict[str, Any] = {}
        for layer in layers:
            data = deep_merge(data, layer.data)
        _default_types(data)
        try:
            return RunConfig.model_validate(data)
        except ValidationError as exc:
            errors = exc.errors()
            if not _retry_as_text(errors, data, layers):
                break
    raise ConfigError("invalid configuration:\n" + "\n".join(_describe(err, data, layers) for err in errors))


def _retry_as_text(errors: list[Any], data: dict[str, Any], layers: list[_Layer]) -> bool:
    """``-c output.run_name=2024`` means the text "2024": where a field wants a string and an override's
    YAML value is a number or boolean, use the value as typed. True if anything changed."""
    changed = False
    for err in errors:
        if err["type"] != "string_type":
            continue
        key = _dotted(err["loc"], data)
        for layer in layers:
            if key in layer.raw_text and not isinstance(_get_path(layer.data, key), str):
                set_path(layer.data, key, layer.raw_text[key])
                changed = True
    return changed


def _get_path(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def _dotted(loc: Sequence[Any], data: dict[str, Any]) -> str:
    """pydantic's error location as the config key: ``("model", "openai", "base_url")`` names the union
    member chosen by ``type``; the key is ``model.base_url``."""
    parts: list[str] = []
    current: Any = data
    for segment in loc:
        segment = str(segment)
        if isinstance(current, dict) and segment not in current and current.get("type") == segment:
            continue
        parts.append(segment)
        current = current.get(segment) if isinstance(current, dict) else None
    return ".".join(parts)


def _describe(err: Any, data: dict[str, Any], layers: list[_Layer]) -> str:
    key = _dotted(err["loc"], data) or "(top)"
    # The source that set the key last; for a missing field, the one that set its section.
    candidates = [key, *(key.rsplit(".", depth)[0] for depth in range(1, key.count(".") + 1))]
    origin = next((o for k in candidates for layer in reversed(layers) if (o := layer.origin(k))), None)
    message = err["msg"] + (_backend_hint(key) if err["type"] == "extra_forbidden" else "")
    return f"  {origin}: {key}: {message}" if origin else f"  {key}: {message}"


def _backend_hint(key: str) -> str:
    """For an option of another backend than the section's ``type`` (``--api-key-env`` with the default
    ``sim`` model): which backends have it."""
    section, _, name = key.partition(".")
    field = RunConfig.model_fields.get(section)
    members = typing.get_args(field.annotation) if field is not None else ()
    owners = [m.model_fields["type"].default for m in members if name in getattr(m, "model_fields", {})]
    return f" (an option of {section}.type {' or '.join(owners)})" if owners else ""
