"""Every class name in `calculet` is defined in one module only, so a name in a traceback, a log
line or a review means one thing.

Classes are read from the source with `ast` (top-level and nested, including classes defined in
functions) under daemon/, client/, gateway/ and ops/, so the test needs no import side effects.
The one deliberate exception is the client's mirrors of the daemon's wire-level types, listed in
`CLIENT_MIRRORS` below; the allow-list itself is checked for stale entries.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "calculet.daemon": "daemon",
    "calculet.client": "client",
    "calculet.gateway": "gateway",
    "calculet.ops": "ops",
}

# The client mirrors the daemon's wire-level types so it never imports the daemon (a client
# install needs nothing of the daemon). Each pair is (class name, client module); the same name
# must also be defined in exactly one daemon module and nowhere else.
CLIENT_MIRRORS: frozenset[tuple[str, str]] = frozenset(
    {
        ("FinishReason", "calculet.client.types"),  # daemon/core/events.py
        ("TokenLogprob", "calculet.client.types"),  # daemon/core/events.py
        ("TokenChunk", "calculet.client.types"),  # daemon/core/events.py
        ("Usage", "calculet.client.types"),  # daemon/core/events.py
        ("Timings", "calculet.client.types"),  # daemon/core/events.py
        ("FinalEvent", "calculet.client.types"),  # daemon/core/events.py
        ("SamplingParams", "calculet.client.types"),  # daemon/sampling/params.py
        ("Constraint", "calculet.client.types"),  # daemon/sampling/constraint.py
        ("ThinkingBudget", "calculet.client.types"),  # daemon/sampling/thinking.py
        ("ModelState", "calculet.client.types"),  # daemon/core/model_state.py
    }
)


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


@functools.cache  # one parse of the tree for the module's tests (they only read the result)
def class_definitions() -> dict[str, frozenset[str]]:
    """Class name -> the modules that define a class of that name."""
    defined: dict[str, set[str]] = defaultdict(set)
    for module, path in _modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                defined[node.name].add(module)
    return {name: frozenset(modules) for name, modules in defined.items()}


def test_source_tree_found() -> None:
    defined = class_definitions()
    assert "DeviceCore" in defined and "AsyncDaemonClient" in defined, sorted(defined)[:20]


def test_each_class_name_is_defined_in_one_module() -> None:
    allowed = dict(CLIENT_MIRRORS)
    clashes = {}
    for name, modules in class_definitions().items():
        others = modules - {allowed[name]} if name in allowed else modules
        if len(others) > 1:
            clashes[name] = sorted(modules)
    assert not clashes, "class names defined in more than one module:\n" + "\n".join(
        f"  {name}: {', '.join(modules)}" for name, modules in sorted(clashes.items())
    )


def test_client_mirror_allow_list_is_not_stale() -> None:
    assert len(dict(CLIENT_MIRRORS)) == len(CLIENT_MIRRORS), "a name is allowed in two client modules"
    defined = class_definitions()
    stale = []
    for name, client_module in sorted(CLIENT_MIRRORS):
        modules = defined.get(name, frozenset())
        daemon_modules = [m for m in modules if m.startswith("calculet.daemon.")]
        in_client = client_module.startswith("calculet.client.") and client_module in modules
        if not in_client or len(daemon_modules) != 1:
            stale.append(f"  {name} ({client_module}): defined in {sorted(modules) or 'no module'}")
    assert not stale, "allow-listed client mirrors that are not a client/daemon pair:\n" + "\n".join(stale)
