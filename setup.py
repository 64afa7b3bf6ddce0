"""Map the repository's top-level folders into the `calculet` namespace.

`common/` -> `calculet.common`, `daemon/` -> `calculet.daemon`, `client/` -> `calculet.client`,
`gateway/` -> `calculet.gateway`, `ops/` -> `calculet.ops`, `protos/calculet/v1/` -> `calculet.v1`
(docs/architecture.md "Rooms and floors"). Every folder below them that holds an `__init__.py` becomes a subpackage, so
new modules need no edit here.
"""

from pathlib import Path

from setuptools import setup

ROOTS = {
    "calculet.common": "common",
    "calculet.daemon": "daemon",
    "calculet.client": "client",
    "calculet.gateway": "gateway",
    "calculet.ops": "ops",
    "calculet.v1": "protos/calculet/v1",
}


def _discover() -> tuple[list[str], dict[str, str]]:
    here = Path(__file__).parent
    packages: list[str] = []
    package_dir: dict[str, str] = {}
    for name, folder in ROOTS.items():
        for init in sorted((here / folder).rglob("__init__.py")):
            rel = init.parent.relative_to(here / folder)
            pkg = ".".join([name, *rel.parts]) if rel.parts else name
            packages.append(pkg)
            package_dir[pkg] = init.parent.relative_to(here).as_posix()
    return packages, package_dir


PACKAGES, PACKAGE_DIR = _discover()
setup(packages=PACKAGES, package_dir=PACKAGE_DIR)
