"""The package's imports go one way: bottom to top through the layers of docs/architecture.md.

Every module of raygen/ is parsed (no import runs); its imports, the lazy ones inside functions included
(only ``if TYPE_CHECKING:`` blocks are left out: they never run), are held against ``LAYERS``. A room is
one top-level module or folder of raygen/; a room may import rooms of its own layer or below, and the rooms
import each other without a circle. Only distributed/ imports ray, only cli/ imports typer and rich. Every
``raygen.*`` name the code, the tests and the benchmarks import or name in a string (``-m raygen.x``,
``mock.patch("raygen.x.y")``, ``import_module("raygen.x")``) must exist: a module that moved leaves none
behind.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "raygen"

# Bottom to top; a room imports only rooms of its own layer or lower ones. docs/architecture.md holds the
# same table (test_the_documented_order_is_this_one).
LAYERS: list[tuple[str, ...]] = [
    ("errors", "config_section", "formats"),
    ("envs", "model", "tools", "input", "safety"),
    ("sim", "verify", "agents", "config", "configfile"),
    ("session", "output"),
    ("hygiene", "eval", "export"),
    ("distributed",),
    ("run",),
    ("cli", "docs_gen"),
]
# Third-party packages one room alone may import.
ONLY_IN = {"ray": "distributed", "typer": "cli", "rich": "cli"}


def layer_of(room: str) -> int:
    for number, rooms in enumerate(LAYERS, start=1):
        if room in rooms:
            return number
    raise AssertionError(
        f"raygen/{room} is in no layer of LAYERS (tests/test_layers.py, docs/architecture.md)"
    )


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def room_of(module: str) -> str | None:
    """``raygen.run.driver`` -> ``run``; the package's own ``__init__`` (``raygen``) belongs to no room."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(path: Path, module: str) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import statement that can run, wherever it stands."""
    is_package = path.name == "__init__.py"

    def walk(node: ast.AST) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    yield from walk(other)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name, child.lineno
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parent = module.split(".") if is_package else module.split(".")[:-1]
                    parent = parent[: len(parent) - (child.level - 1)]
                    base = ".".join([*parent, *([child.module] if child.module else [])])
                for alias in child.names:
                    # `from raygen.cli import eval` imports the module raygen.cli.eval
                    submodule = f"{base}.{alias.name}"
                    yield (submodule if submodule in modules() else base), child.lineno
            yield from walk(child)

    yield from walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))


@cache
def all_imports() -> list[tuple[str, str, int]]:
    """(importing module, imported module, line) over raygen/."""
    return [
        (module, target, line) for module, path in modules().items() for target, line in imports(path, module)
    ]


def where(module: str, line: int) -> str:
    return f"{modules()[module].relative_to(ROOT)}:{line}"


def room_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, target, _line in all_imports():
        source, dest = room_of(module), room_of(target) if target.startswith("raygen.") else None
        if source and dest and source != dest:
            graph.setdefault(source, set()).add(dest)
    return graph


def upward_imports() -> list[str]:
    problems = []
    for module, target, line in all_imports():
        if not target.startswith("raygen."):
            continue
        source, dest = room_of(module), room_of(target)
        if source is None or dest is None or source == dest:
            continue
        if layer_of(dest) > layer_of(source):
            problems.append(
                f"{where(module, line)}: {module} (layer {layer_of(source)}) imports {target} "
                f"(layer {layer_of(dest)}, above it)"
            )
    return problems


def test_every_room_has_a_layer() -> None:
    rooms = {room_of(module) for module in modules()} - {None}
    listed = {room for rooms_ in LAYERS for room in rooms_}
    assert rooms == listed, f"rooms without a layer: {sorted(rooms - listed)}; gone: {sorted(listed - rooms)}"


def test_imports_go_down_the_layers() -> None:
    problems = upward_imports()
    assert not problems, "imports against the layer order (docs/architecture.md):\n" + "\n".join(problems)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, str] = {}
    trail: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        trail.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return [*trail[trail.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        trail.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_rooms_import_each_other_without_a_circle() -> None:
    cycle = find_cycle(room_graph())
    assert cycle is None, "a circle between raygen/'s rooms: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("package, room", sorted(ONLY_IN.items()))
def test_a_third_party_package_is_imported_by_its_room_alone(package: str, room: str) -> None:
    offenders = [
        f"{where(module, line)}: {module} imports {target}"
        for module, target, line in all_imports()
        if target.split(".")[0] == package and room_of(module) != room
    ]
    assert not offenders, f"only raygen/{room}/ imports {package}:\n" + "\n".join(offenders)


def defined_names(path: Path) -> set[str]:
    """The names a module defines or imports at its top level (what ``module.name`` can reach)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def dotted_name_exists(name: str) -> bool:
    """``raygen.a.b`` is a module, or a name defined in the longest module it starts with."""
    parts = name.split(".")
    for cut in range(len(parts), 1, -1):
        prefix = ".".join(parts[:cut])
        if prefix in modules():
            return cut == len(parts) or parts[cut] in defined_names(modules()[prefix])
    return False


_DOTTED = re.compile(r"raygen(?:\.\w+)+")
_RUN_MODULE = re.compile(r"-m (raygen(?:\.\w+)+)")
# Calls whose first argument names a module or an attribute path: mock.patch("raygen.x.y"),
# monkeypatch.setattr("raygen.x.y", ...), importlib.import_module("raygen.x"), runpy.run_module(...).
_NAMING_CALLS = {"patch", "setattr", "delattr", "import_module", "run_module", "find_spec"}


def _call_name(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def raygen_names(path: Path) -> Iterator[tuple[str, int]]:
    """The raygen.* names a Python file imports, and those its strings name: a whole string whose second part
    is a room of raygen/ (the backend tables), the first argument of a patching or importing call, a string
    after ``-m``."""
    rooms = {room_of(module) for module in modules()}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names if alias.name.startswith("raygen."))
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("raygen"):
            yield node.module or "", node.lineno
        elif isinstance(node, ast.Call) and _call_name(node) in _NAMING_CALLS and node.args:
            first = node.args[0]
            if (
                isinstance(first, ast.Constant)
                and isinstance(first.value, str)
                and _DOTTED.fullmatch(first.value)
            ):
                yield first.value, node.lineno
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _DOTTED.fullmatch(node.value) and node.value.split(".")[1] in rooms:
                yield node.value, node.lineno
            yield from ((match, node.lineno) for match in _RUN_MODULE.findall(node.value))
        elif isinstance(node, ast.List | ast.Tuple):
            items = [item.value if isinstance(item, ast.Constant) else None for item in node.elts]
            pairs = itertools.pairwise(items)
            yield from (
                (name, node.lineno) for flag, name in pairs if flag == "-m" and _DOTTED.fullmatch(name or "")
            )


def test_every_raygen_name_in_code_tests_and_benchmarks_exists() -> None:
    folders = ("raygen", "tests", "bench", "examples")
    files = [path for folder in folders for path in (ROOT / folder).rglob("*.py") if path != Path(__file__)]
    missing = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in sorted(files)
        for name, line in raygen_names(path)
        if name != "raygen" and not dotted_name_exists(name)
    ]
    assert not missing, "names of raygen modules that do not exist (a missed rename?):\n" + "\n".join(missing)


def documented_layers() -> list[tuple[str, ...]]:
    """The rows of docs/architecture.md's layer table: | N | `room`, `room/`, ... | what they hold |."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+) \| ([^|]+) \|", text, re.M)
    assert rows, "docs/architecture.md has no layer table (| 1 | `errors`, ... | ... |)"
    assert [int(number) for number, _rooms in rows] == list(range(1, len(rows) + 1))
    return [tuple(name.rstrip("/") for name in re.findall(r"`([\w/]+)`", rooms)) for _number, rooms in rows]


def test_the_documented_order_is_this_one() -> None:
    assert documented_layers() == LAYERS


def test_the_check_finds_an_upward_import(tmp_path: Path) -> None:
    """The checker itself: a lazy import of the driver from a backend, hidden in a function, is found."""
    bad = tmp_path / "raygen" / "envs" / "bad.py"
    bad.parent.mkdir(parents=True)
    bad.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from raygen.cli import app\n"
        "def f():\n    from raygen.run.driver import run\n"
    )
    found = list(imports(bad, "raygen.envs.bad"))
    assert found == [("typing", 1), ("raygen.run.driver", 5)]
    assert layer_of(room_of("raygen.run.driver") or "") > layer_of("envs")
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert not dotted_name_exists("raygen.runner.run") and dotted_name_exists("raygen.run.driver.run")
