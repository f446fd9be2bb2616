"""Harbor task folders as input: ``raygen run TASKS_DIR``.

A Harbor task is a folder::

    instruction.md          the prompt
    task.toml               [metadata] (category, ...), [verifier] timeout_sec, [environment] docker_image
    environment/Dockerfile  the task's image (built when task.toml names no docker_image)
    tests/test.sh           the hidden check; writes /logs/verifier/reward.txt (a float) or reward.json

``load_tasks`` turns a folder of such folders into rows of raygen's JSONL form (validated with
file: field messages), so the rest of the run is the same as for a prompts file. The tests become
``verify.files`` under ``.raygen-tests/``; at grading time the command moves them to ``/tests`` (clearing
whatever the agent left at ``/tests`` and ``/logs/verifier``), runs ``bash /tests/test.sh`` and copies
the reward out. Harbor runs tests in the agent's container, and tasks declare no artifacts, so the mode
is ``same`` unless ``[verifier]`` lists ``artifacts`` (a raygen extension; then ``fresh``).

Tests write to ``/tests`` and ``/logs``, so Harbor tasks need a container backend (Docker, Singularity,
Modal); the local backend would write them on the host and is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raygen.envs import environment_class
from raygen.errors import ConfigError, InputError, SessionFailure

STAGE_DIR = ".raygen-tests"
REWARD_COPY = ".raygen-reward"
# Whatever the agent left at /tests and /logs/verifier goes first; test.sh's exit code does not matter
# (Harbor reads only the reward file), and a missing reward file is a check that could not run.
_GRADE = (
    "rm -rf /tests /logs/verifier && mkdir -p /tests /logs/verifier && cp -R {stage}/. /tests/"
    " && rm -rf {stage} && (bash /tests/test.sh; true)"
    " && if [ -f /logs/verifier/reward.txt ]; then cp /logs/verifier/reward.txt {reward};"
    " elif [ -f /logs/verifier/reward.json ]; then cp /logs/verifier/reward.json {reward}; fi"
)


def is_task_dir(path: Path) -> bool:
    """Whether ``path`` is a folder of Harbor tasks (or one task) rather than a JSONL file."""
    return path.is_dir()


@dataclass
class HarborTask:
    name: str
    folder: Path
    row: dict[str, Any] = field(default_factory=dict)
    dockerfile: Path | None = None
    """Build context's Dockerfile, when the row's image has to be built."""


def task_folders(root: Path) -> list[Path]:
    if (root / "task.toml").exists():
        return [root]
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def _problem(problems: list[str], path: Path, name: str, message: str) -> None:
    problems.append(f"{path}: {name}: {message}")


def _read_text(path: Path, problems: list[str]) -> str | None:
    """The file's text, or None with one problem line (missing, a directory, not UTF-8, unreadable)."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        _problem(problems, path, "(file)", "missing")
    except IsADirectoryError:
        _problem(problems, path, "(file)", "a directory, not a file")
    except UnicodeDecodeError as exc:
        _problem(problems, path, "(file)", f"not UTF-8 text ({exc.reason} at byte {exc.start})")
    except OSError as exc:
        _problem(problems, path, "(file)", f"cannot be read: {exc.strerror or exc}")
    return None


def _links_out(folder: Path, problems: list[str]) -> bool:
    """Whether any symbolic link under ``folder`` leads out of it (each one a problem). Task folders are
    shared datasets: a link to a host file (cloud credentials) would be read, staged into the container
    and stored with every record, so none is followed (issue 28)."""
    inside = folder.resolve()
    found = False
    for parent, dirs, files in os.walk(folder):  # does not descend into linked folders
        for name in sorted(dirs + files):
            path = Path(parent) / name
            if not path.is_symlink():
                continue
            target = path.resolve()
            if target != inside and inside not in target.parents:
                message = f"a symbolic link out of the task folder (to {target}); task folders are shared: "
                _problem(problems, path, "(file)", message + "copy the file in")
                found = True
    return found


def _read_toml(path: Path, problems: list[str]) -> dict[str, Any]:
    text = _read_text(path, problems)
    if text is None:
        return {}
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        _problem(problems, path, "(toml)", f"invalid TOML: {exc}")
    return {}


def _read_tests(folder: Path, problems: list[str]) -> dict[str, str]:
    tests = folder / "tests"
    if not (tests / "test.sh").is_file():
        _problem(problems, tests / "test.sh", "(file)", "missing")
        return {}
    files = {}
    for path in sorted(p for p in tests.rglob("*") if p.is_file()):
        try:
            files[f"{STAGE_DIR}/{path.relative_to(tests).as_posix()}"] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            _problem(problems, path, "(file)", "not UTF-8 text (hidden files are staged as text)")
        except OSError as exc:
            _problem(problems, path, "(file)", f"cannot be read: {exc.strerror or exc}")
    return files


def _section(data: dict[str, Any], name: str, path: Path, problems: list[str]) -> dict[str, Any]:
    value = data.get(name, {})
    if not isinstance(value, dict):
        _problem(problems, path, name, "must be a table")
        return {}
    return value


def _context_hash(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def read_task(folder: Path, problems: list[str]) -> HarborTask | None:
    """One task folder as a row (problems appended as ``path: field: message``)."""
    before = len(problems)
    if _links_out(folder, problems):
        return None  # nothing of the folder is read
    task = HarborTask(name=folder.name, folder=folder)
    instruction = folder / "instruction.md"
    prompt = _read_text(instruction, problems)
    if prompt is not None and not prompt.strip():
        _problem(problems, instruction, "(file)", "empty")
    prompt = prompt or ""
    toml_path = folder / "task.toml"
    data = _read_toml(toml_path, problems)
    metadata = _section(data, "metadata", toml_path, problems)
    verifier = _section(data, "verifier", toml_path, problems)
    environment = _section(data, "environment", toml_path, problems)
    files = _read_tests(folder, problems)
    image = environment.get("docker_image")
    if image is not None and not isinstance(image, str):
        _problem(problems, toml_path, "environment.docker_image", "must be a string")
    if image is None:
        dockerfile = folder / "environment" / "Dockerfile"
        if not dockerfile.is_file():
            _problem(
                problems, dockerfile, "(file)", "missing (and task.toml names no environment.docker_image)"
            )
        else:
            task.dockerfile = dockerfile
            image = f"raygen-harbor/{_slug(folder.name)}:{_context_hash(dockerfile.parent)}"
    cwd = _workdir(task.dockerfile) if task.dockerfile is not None else environment.get("workdir")
    artifacts = verifier.get("artifacts", [])
    command = _GRADE.format(stage=STAGE_DIR, reward=REWARD_COPY)
    verify = {
        "files": files,
        "command": command,
        "timeout_s": verifier.get("timeout_sec", 600.0),
        "result": "reward_file",
        "reward_file": REWARD_COPY,
        "pass_threshold": verifier.get("pass_threshold", 1.0),
        "mode": "fresh" if artifacts else "same",
        "artifacts": artifacts,
    }
    category = metadata.get("category")
    task.row = {
        "id": folder.name,
        "prompt": prompt,
        **({"category": category} if isinstance(category, str) else {}),
        "image": image,
        **({"cwd": cwd} if isinstance(cwd, str) else {}),
        "verify": verify,
        "metadata": {"harbor_task": folder.name, **{k: v for k, v in metadata.items() if _jsonable(v)}},
    }
    if "mcp_servers" in environment:
        task.row["mcp_servers"] = _mcp_servers(environment["mcp_servers"], toml_path, problems)
    _check_row(task.row, toml_path, problems)
    return task if len(problems) == before else None


_HARBOR_TRANSPORTS = {"stdio": None, "sse": "sse", "streamable-http": "http", "http": "http"}


def _mcp_servers(entries: Any, path: Path, problems: list[str]) -> dict[str, Any]:
    """``[[environment.mcp_servers]]`` (name, transport, command, args, env, url) as a row's
    ``mcp_servers``: they run in the task's own sandbox like any row's servers."""
    servers: dict[str, Any] = {}
    for i, entry in enumerate(entries if isinstance(entries, list) else [entries]):
        where = f"environment.mcp_servers[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            _problem(problems, path, where, "needs a table with a string 'name'")
            continue
        spec = {k: v for k, v in entry.items() if k not in ("name", "transport")}
        transport = entry.get("transport", "stdio" if "command" in entry else "streamable-http")
        if transport not in _HARBOR_TRANSPORTS:
            _problem(problems, path, f"{where}.transport", f"one of {', '.join(_HARBOR_TRANSPORTS)}")
            continue
        if _HARBOR_TRANSPORTS[transport]:
            spec["type"] = _HARBOR_TRANSPORTS[transport]
        servers[entry["name"]] = spec
    return servers


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _check_row(row: dict[str, Any], toml_path: Path, problems: list[str]) -> None:
    """The row's fields through the same schema as a JSONL row; errors point at task.toml's keys."""
    from pydantic import ValidationError

    from raygen.input.rows import PromptRow

    toml_names = {"timeout_s": "verifier.timeout_sec", "pass_threshold": "verifier.pass_threshold"}
    toml_names["artifacts"] = "verifier.artifacts"
    try:
        PromptRow.model_validate(row)
    except ValidationError as exc:
        for err in exc.errors():
            loc = [str(part) for part in err["loc"]]
            if loc[:1] == ["verify"] and len(loc) > 1:
                name = toml_names.get(loc[1], "verify." + ".".join(loc[1:]))
            else:
                name = ".".join(loc) or "(task)"
            if loc[:1] == ["prompt"]:
                continue  # already reported against instruction.md
            _problem(problems, toml_path, name, err["msg"].removeprefix("Value error, "))


def _workdir(dockerfile: Path) -> str | None:
    """The Dockerfile's last absolute ``WORKDIR``: where the task expects the agent to work (container
    backends start commands in ``env.workdir`` otherwise)."""
    found = None
    for line in dockerfile.read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.strip().split(None, 1)
        if len(parts) == 2 and parts[0].upper() == "WORKDIR" and parts[1].strip().startswith("/"):
            found = parts[1].strip()
    return found


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9_.-]+", "-", text.lower()).strip("-.") or "task"


def load_tasks(root: Path, env_type: str) -> list[HarborTask]:
    """Every task under ``root``; raises InputError listing every problem of every task."""
    if not environment_class(env_type).own_root_filesystem:
        raise ConfigError(
            f"{root}: Harbor tasks write /tests and /logs/verifier, which the {env_type} backend would put "
            "on the host: run them with --env docker (or singularity, modal)"
        )
    problems: list[str] = []
    tasks = [task for folder in task_folders(root) if (task := read_task(folder, problems)) is not None]
    if problems:
        raise InputError(
            f"{root}: {len(problems)} problem(s) in Harbor tasks:\n" + "\n".join(problems), problems
        )
    if not tasks:
        raise InputError(f"{root}: no Harbor task folders (each needs instruction.md, task.toml, tests/)")
    return tasks


def tasks_to_jsonl(root: Path, env_type: str, out_dir: Path | None = None) -> tuple[Path, list[HarborTask]]:
    """Write the tasks of ``root`` as a JSONL prompts file (in a cache folder keyed by the tasks' path, so a
    resume reads the same file) and return it with the tasks."""
    tasks = load_tasks(root, env_type)
    cache = out_dir or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "raygen" / "harbor"
    cache.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:12]
    path = cache / f"{_slug(root.resolve().name)}-{key}.jsonl"
    body = "".join(json.dumps(task.row, ensure_ascii=False) + "\n" for task in tasks)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(body, encoding="utf-8")
    os.replace(tmp, path)
    return path, tasks


def build_images(tasks: list[HarborTask], env_config: Any) -> dict[str, str | None]:
    """Build the image of every task that has a Dockerfile and no prebuilt image, with the run's backend
    (Docker builds; backends that cannot build skip it), skipped when the tag exists: the tag hashes the
    build context. A task needing the network to build names a prebuilt environment.docker_image instead.
    Returns ``{image: None or why it failed}``."""
    contexts = {task.row["image"]: task.dockerfile.parent for task in tasks if task.dockerfile is not None}
    try:
        return environment_class(env_config.type).build_images(env_config, contexts)
    except SessionFailure as exc:  # before any model call: a clear error, not a crash
        raise ConfigError(f"building the Harbor task images: {exc.detail}") from None
