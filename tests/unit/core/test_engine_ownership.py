"""The engine owns its state (issue 8): no module of `calculet` outside `daemon/core/engine*.py`
takes the engine's lock or reads or writes its fields; they call its public methods, which return
copies or frozen views. Read from the source with `ast`, so a new shortcut fails here by name.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGE_DIRS = ("daemon", "client", "gateway", "ops")
ENGINE_FILE = ROOT / "daemon" / "core" / "engine.py"


def _class(path: Path, name: str) -> ast.ClassDef:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def _engine_class() -> ast.ClassDef:
    return _class(ENGINE_FILE, "Engine")


def public_api() -> set[str]:
    """Names of the Engine's public methods and properties (`generations` hands out its generation
    operations, whose own methods take the engine lock)."""
    return {n.name for n in _engine_class().body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}


def engine_fields() -> set[str]:
    """Every attribute the Engine assigns on itself."""
    return {
        t.attr
        for n in ast.walk(_engine_class())
        if isinstance(n, ast.Assign | ast.AnnAssign)
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    }


def _outside_modules() -> list[Path]:
    return [
        path
        for folder in PACKAGE_DIRS
        for path in sorted((ROOT / folder).rglob("*.py"))
        if not (path.parent == ENGINE_FILE.parent and path.name.startswith("engine"))
    ]


def _names_an_engine(node: ast.expr) -> bool:
    """`engine`, `self.engine`, `core.engine`, ...: an expression that holds the board's Engine."""
    return (isinstance(node, ast.Name) and node.id == "engine") or (
        isinstance(node, ast.Attribute) and node.attr == "engine"
    )


def violations(source: str, api: set[str], private: set[str]) -> list[str]:
    """Uses of an engine that are not its public API, and touches of its private field names on
    anything but `self` (which would be another object's own field)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        on_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
        if (_names_an_engine(node.value) and node.attr not in api) or (node.attr in private and not on_self):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_every_field_of_the_engine_is_private() -> None:
    fields = engine_fields()
    assert {"_cond", "_jobs", "_scheduler", "_executor", "_generations"} <= fields
    assert sorted(f for f in fields if not f.startswith("_")) == []


def test_the_checker_catches_what_it_is_meant_to() -> None:
    api, private = {"snapshot"}, {"_cond", "_jobs"}
    bad = "core.engine.snapshot()\nwith core.engine._cond:\n    pass\nengine.admitting = False\nx = e._jobs\n"
    assert len(violations(bad, api, private)) == 3
    assert violations("self._jobs = 1\nengine.snapshot()\nself.engine.snapshot()\n", api, private) == []


def test_no_module_outside_the_engine_touches_its_lock_or_state() -> None:
    api = public_api()
    assert {"snapshot", "stop_admitting", "resume", "wait_drained", "resets", "submit", "generations"} <= api
    private = {f for f in engine_fields() if f.startswith("_")}
    problems = {
        str(path.relative_to(ROOT)): found
        for path in _outside_modules()
        if (found := violations(path.read_text(encoding="utf-8"), api, private))
    }
    assert problems == {}
