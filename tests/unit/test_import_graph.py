"""The import graph of `calculet` has no cycle (issue 8): a module's runtime imports never lead back
to it. Imports under `if TYPE_CHECKING:` are left out here; the one type-level cycle left
(`daemon/core/completion.py` names the `Engine` it is given) goes with issue 8's completion step.

The graph is read from the source (module-level `import` / `from ... import` statements), so the
test needs no import side effects and names the cycle it finds.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
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


def _imports(tree: ast.Module, modules: dict[str, Path]) -> set[str]:
    deps: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("calculet."):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                deps.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            deps.update(a.name for a in node.names if a.name.startswith("calculet."))
    return {d for d in deps if d in modules}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(ast.parse(path.read_text(encoding="utf-8")), modules) for name, path in modules.items()}


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


def test_calculet_has_no_import_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 100 and "calculet.daemon.core.engine" in graph
    cycle = find_cycle(graph)
    if cycle is not None:
        pytest.fail("import cycle: " + " -> ".join(cycle))
