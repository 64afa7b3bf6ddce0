"""The import graph of `calculet` has no cycle (issue 8): a module's imports never lead back to it,
neither at run time nor at type level (imports under `if TYPE_CHECKING:` count too, so no cycle can
hide there: the completion step once named the `Engine` that called it).

The graph is read from the source (module-level `import` / `from ... import` statements), so the
test needs no import side effects and names the cycle it finds.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "calculet.common": "common",
    "calculet.daemon": "daemon",
    "calculet.client": "client",
    "calculet.gateway": "gateway",
    "calculet.ops": "ops",
}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def _statements(tree: ast.Module, type_level: bool) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out += node.body if type_level else []
        else:
            out.append(node)
    return out


def _imports(tree: ast.Module, modules: dict[str, Path], type_level: bool) -> set[str]:
    deps: set[str] = set()
    for node in _statements(tree, type_level):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("calculet."):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                deps.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            deps.update(a.name for a in node.names if a.name.startswith("calculet."))
    return {d for d in deps if d in modules}


def import_graph(*, type_level: bool = False) -> dict[str, set[str]]:
    """Module -> the calculet modules it imports at module level (`type_level`: also under
    `if TYPE_CHECKING:`)."""
    modules = _modules()
    return {
        name: _imports(ast.parse(path.read_text(encoding="utf-8")), modules, type_level)
        for name, path in modules.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path `[a, b, ..., a]`, or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)) is not None:
            return cycle
    return None


def test_the_finder_sees_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_type_checking_imports_are_part_of_the_type_level_graph() -> None:
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from calculet.daemon.core import engine\n"
    tree = ast.parse(source)
    modules = {"calculet.daemon.core.engine": Path("engine.py")}
    assert _imports(tree, modules, type_level=False) == set()
    assert _imports(tree, modules, type_level=True) == {"calculet.daemon.core.engine"}


@pytest.mark.parametrize("type_level", [False, True], ids=["runtime", "type-level"])
def test_calculet_has_no_import_cycle(type_level: bool) -> None:
    graph = import_graph(type_level=type_level)
    assert len(graph) > 100 and "calculet.daemon.core.engine" in graph
    cycle = find_cycle(graph)
    if cycle is not None:
        pytest.fail("import cycle: " + " -> ".join(cycle))
