"""deploy/docker/Dockerfile and .dockerignore, checked without Docker (no base image can be pulled
here): the file is parsed (dockerfile-parse) and the build context computed with the Docker SDK's own
.dockerignore matcher (`docker.utils.build.exclude_paths`).

- Two stages, `build` then `runtime` (the default target), both on the Python 3.11 slim image; the
  build stage makes wheels of the repository, the runtime stage installs them offline from it.
- The runtime stage runs as a non-root user that it creates, with the UID/GID the manifests' pods
  run as; it has no ENTRYPOINT, so each manifest's `command` is what runs, and its CMD is a console
  script.
- Every container in deploy/kubernetes runs a console script that pyproject.toml declares, and every
  `image:` (and the kustomization's `images:` override) names the tag docs/operations.md tells
  operators to build, which is the package's version.
- The build context keeps every file of the package folders and what the wheel build reads, drops
  the virtualenv and the git directory, and a wheel built from exactly that context declares the
  console scripts.
- No model package is built at image build time.
"""

from __future__ import annotations

import ast
import configparser
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from docker.utils.build import exclude_paths
from dockerfile_parse import DockerfileParser

from .test_kubernetes_manifests import kustomization, pod_specs

REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"
DOCS = REPO / "docs" / "operations.md"
BUILD_COMMAND = re.compile(r"docker build -f (?P<file>\S+) -t (?P<tag>\S+) (?P<context>\S+)")
WHEEL_READS = ("pyproject.toml", "setup.py", "README.md")  # setup.py's folders come on top of these
NEVER_SENT = (".git", ".venv")  # large, and nothing the image needs


@dataclass
class Stage:
    name: str
    image: str
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (INSTRUCTION, value)

    def values(self, instruction: str) -> list[str]:
        return [v for i, v in self.instructions if i == instruction]


def stages() -> list[Stage]:
    parser = DockerfileParser(path=str(DOCKERFILE))
    images = iter(parser.parent_images)  # FROM images with the ARG defaults substituted
    found: list[Stage] = []
    for item in parser.structure:
        instruction, value = item["instruction"], item["value"]
        if instruction == "FROM":
            words = value.split()
            assert len(words) == 3 and words[1].upper() == "AS", f"every stage is named: FROM {value}"
            found.append(Stage(words[2], next(images)))
        elif instruction != "COMMENT" and found:
            found[-1].instructions.append((instruction, value))
    return found


def stage(name: str) -> Stage:
    (found,) = [s for s in stages() if s.name == name]
    return found


def console_scripts() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return set(project["scripts"])


def documented_build() -> re.Match[str]:
    (command,) = set(BUILD_COMMAND.finditer(DOCS.read_text(encoding="utf-8")))
    return command


def package_folders() -> list[str]:
    """The folders setup.py maps into the calculet namespace (its ROOTS)."""
    tree = ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))
    (roots,) = [n.value for n in tree.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "ROOTS"]
    return list(ast.literal_eval(roots).values())


def build_context(root: Path = REPO) -> set[str]:
    """The paths `docker build` sends from `root` under the repository's .dockerignore."""
    lines = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return set(exclude_paths(str(root), patterns, dockerfile=str(DOCKERFILE.relative_to(REPO))))


def _user_ids(runtime: Stage) -> tuple[str, str]:
    """(uid, gid) created by the runtime stage's useradd/groupadd."""
    words = [w for run in runtime.values("RUN") for w in shlex.split(run)]
    uid = words[words.index("--uid", words.index("useradd")) + 1]
    gid = words[words.index("--gid", words.index("groupadd")) + 1]
    return uid, gid


# ---------------------------------------------------------------------------------------- stages


def test_two_stages_on_python_3_11_slim_the_runtime_last() -> None:
    found = stages()
    assert [s.name for s in found] == ["build", "runtime"], "the default target is the last stage"
    for s in found:
        assert re.fullmatch(r"python:3\.11-slim(-\w+)?", s.image), (s.name, s.image)


def test_the_build_stage_makes_wheels_of_the_repository_and_the_runtime_installs_them_offline() -> None:
    build = stage("build")
    assert build.values("COPY") == [". ."], "the whole context (the repository less .dockerignore)"
    (wheel,) = [w for w in map(shlex.split, build.values("RUN")) if {"pip", "wheel"} <= set(w)]
    wheels = wheel[wheel.index("--wheel-dir") + 1]
    assert wheel[-1].startswith("."), "a wheel of the repository itself (with any extras)"
    (install,) = [w for w in map(shlex.split, stage("runtime").values("RUN")) if {"pip", "install"} <= set(w)]
    mount = dict(kv.split("=", 1) for kv in install[0].removeprefix("--mount=").split(","))
    assert mount == {"type": "bind", "from": "build", "source": wheels, "target": mount["target"]}, mount
    assert "--no-index" in install and install[install.index("--find-links") + 1] == mount["target"]
    assert install[-1].startswith("calculet"), install


def test_the_runtime_runs_as_its_own_non_root_user_with_the_manifests_ids() -> None:
    runtime = stage("runtime")
    user = runtime.values("USER")[-1]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and gid.isdigit(), f"USER {user}: numeric, so runAsNonRoot can verify it"
    assert int(uid) != 0 and int(gid) != 0, f"USER {user}"
    assert (uid, gid) == _user_ids(runtime), "the user the stage creates"
    for name, spec in pod_specs():
        pod = spec["securityContext"]
        assert (pod["runAsUser"], pod["runAsGroup"]) == (int(uid), int(gid)), name


def test_no_entrypoint_and_the_default_command_is_a_console_script() -> None:
    for s in stages():
        assert not s.values("ENTRYPOINT"), f"stage {s.name}: the manifests' command must be what runs"
    (cmd,) = stage("runtime").values("CMD")
    argv = json.loads(cmd)  # exec form: no shell in between
    assert argv[0] in console_scripts(), argv


def test_no_model_package_is_built_into_the_image() -> None:
    for s in stages():
        for run in s.values("RUN"):
            assert "build-sim" not in run and "calctl" not in shlex.split(run), (s.name, run)


# ---------------------------------------------------------------------------------------- manifests


def _containers() -> list[tuple[str, dict[str, Any]]]:
    return [(f"{name}/{c['name']}", c) for name, spec in pod_specs() for c in spec["containers"]]


def test_every_manifest_container_runs_a_declared_console_script() -> None:
    scripts = console_scripts()
    found = _containers()
    assert len(found) >= 3  # two boards and the gateway
    for where, container in found:
        argv = container.get("command", []) + container.get("args", [])
        assert argv and argv[0] in scripts, (where, argv[:1], sorted(scripts))


def test_every_image_is_the_tag_the_docs_build_and_the_package_version() -> None:
    command = documented_build()
    assert REPO / command["file"] == DOCKERFILE and command["context"] == "."
    tag = command["tag"]
    version = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    assert tag == f"calculet:{version}", tag
    for where, container in _containers():
        assert container["image"] == tag, where
    (override,) = kustomization()["images"]
    assert f"{override['newName']}:{override['newTag']}" == tag


# ---------------------------------------------------------------------------------------- context


def test_the_build_context_keeps_the_package_and_drops_the_rest() -> None:
    context = build_context()
    for name in WHEEL_READS:
        assert name in context, f"{name}: the wheel build reads it"
    folders = package_folders()
    assert folders and all((REPO / f / "__init__.py").is_file() for f in folders), folders
    for folder in folders:
        for path in (REPO / folder).rglob("*"):
            rel = path.relative_to(REPO).as_posix()
            if path.is_file() and "__pycache__" not in path.parts:
                assert rel in context, f"{rel}: .dockerignore drops a file of the package"
    assert "tests/unit/ops/test_dockerfile.py" not in context
    for name in NEVER_SENT:
        assert not any(p == name or p.startswith(f"{name}/") for p in context), name


def test_the_build_context_never_holds_a_virtualenv_or_git_directory(tmp_path: Path) -> None:
    """The same patterns over a tree that surely has them (a checkout may lack either)."""
    for name in NEVER_SENT:
        (tmp_path / name / "sub").mkdir(parents=True)
        (tmp_path / name / "sub" / "file").write_text("x", encoding="utf-8")
    (tmp_path / "setup.py").write_text("", encoding="utf-8")
    assert build_context(tmp_path) == {"setup.py"}


def test_a_wheel_built_from_the_context_declares_the_console_scripts(tmp_path: Path) -> None:
    root = tmp_path / "context"
    for rel in sorted(build_context()):
        source = REPO / rel
        if source.is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / rel)
    out = tmp_path / "wheels"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(root)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    (wheel,) = out.glob("calculet-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        ep = next(n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt"))
        entry_points = configparser.ConfigParser()
        entry_points.read_string(archive.read(ep).decode())
    assert console_scripts() <= set(entry_points["console_scripts"]), dict(entry_points["console_scripts"])
