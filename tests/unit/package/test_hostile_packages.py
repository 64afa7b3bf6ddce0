"""Hostile package directories (issue 7, item 8): each gets its validator code from
`validate_package`, `calctl package validate` and the daemon's Load, never an exception.

Covers what a careless or hostile operator can put on disk: manifests nested past any sane depth,
huge, not regular files (FIFO, device node, directory), symlink loops (the manifest, a listed file,
a folder, the package root), non-UTF-8 or lone-surrogate text, NaN/Infinity and integers no board
figure can hold, unreadable files (permission denied: as root, checked in a child process that
drops to `nobody`), folders nested deeper than Python's recursion limit and chat templates that
nest too deeply for Jinja2's parser.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from calculet.common.errors import FailedPrecondition
from calculet.daemon.package.manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    MAX_MANIFEST_DEPTH,
    ManifestError,
    load_manifest,
)
from calculet.daemon.package.report import CODES
from calculet.daemon.package.validate import validate_package
from calculet.ops.calctl import main
from calculet.ops.sim_packages.build import build_sim_package
from tests.unit.core.engine_factories import running_core

from .conftest import FILES, PackageFactory, valid_manifest

NOBODY = 65534


def _write_manifest_text(root: Path, text: str | bytes) -> None:
    path = root / MANIFEST_NAME
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)


def _raw_text(root: Path) -> str:
    return (root / MANIFEST_NAME).read_text()


def _replace_by(kind: str) -> Callable[[Path], None]:
    """Replace a path by a FIFO, a character device (like /dev/null), a directory or a self-loop symlink."""

    def change(path: Path) -> None:
        path.unlink()
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "device":
            try:
                os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
            except PermissionError:
                pytest.skip("mknod needs CAP_MKNOD")
        elif kind == "dir":
            path.mkdir()
        elif kind == "loop":
            os.symlink(path.name, path)

    return change


def _nested_unknown_field(depth: int) -> Callable[[Path], None]:
    def change(root: Path) -> None:
        raw = json.loads(_raw_text(root))
        node: Any = 1
        for _ in range(depth):
            node = [node]
        raw["vendor_extra"] = node
        _write_manifest_text(root, json.dumps(raw))

    return change


def _huge(root: Path) -> None:
    """A valid manifest padded with blanks to one byte over the cap: refused before it is parsed."""
    text = _raw_text(root)
    _write_manifest_text(root, text + " " * (MAX_MANIFEST_BYTES + 1 - len(text.encode())))


def _symlink_out(root: Path) -> None:
    outside = root.parent / f"{root.name}-manifest.json"
    (root / MANIFEST_NAME).rename(outside)
    os.symlink(outside, root / MANIFEST_NAME)


def _text_edit(old: str, new: str) -> Callable[[Path], None]:
    def change(root: Path) -> None:
        text = _raw_text(root)
        assert old in text, old
        _write_manifest_text(root, text.replace(old, new, 1))

    return change


def _deep_folders(root: Path) -> None:
    """An unlisted file 1,200 folders down: more levels than os.walk's recursion can take on 3.11."""
    deep = root
    for _ in range(1200):  # one level at a time: mkdir(parents=True) itself recurses per level
        deep = deep / "d"
        deep.mkdir()
    (deep / "x").write_text("x")


def _remove_tree(top: Path) -> None:
    """shutil.rmtree without recursion (it recurses per level; pytest's cleanup of old temp folders
    would hit RecursionError on the 1,200-deep tree in a later run)."""
    pending = [top]
    while pending:
        folder = pending[-1]
        with os.scandir(folder) as it:
            entries = list(it)
        subfolders = [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]
        for e in entries:
            if not e.is_dir(follow_symlinks=False):
                os.unlink(e.path)
        if subfolders:
            pending.extend(subfolders)
        else:
            folder.rmdir()
            pending.pop()


@pytest.fixture(autouse=True)
def _no_deep_leftovers(tmp_path: Path) -> Iterator[None]:
    yield
    for deep in tmp_path.glob("*/d"):
        _remove_tree(deep)


def _nested_template(root: Path) -> None:
    raw = json.loads(_raw_text(root))
    raw["tokenizer"]["chat_template"] = "{% if a %}" * 3000 + "{% endif %}" * 3000
    _write_manifest_text(root, json.dumps(raw))


def _loop_folder(root: Path) -> None:
    shutil.rmtree(root / "prefill")
    os.symlink("prefill", root / "prefill")


def _extra_fifo(root: Path) -> None:
    os.mkfifo(root / "pipe")


@dataclass(frozen=True)
class Hostile:
    codes: frozenset[str]
    change: Callable[[Path], None]
    expect_in_message: str = ""


def _h(codes: str | set[str], change: Callable[[Path], None], expect: str = "") -> Hostile:
    return Hostile(frozenset({codes} if isinstance(codes, str) else codes), change, expect)


HOSTILE: dict[str, Hostile] = {
    "manifest-nested-array": _h("manifest.too_deep", lambda r: _write_manifest_text(r, "[" * 100_000 + "]" * 100_000)),
    "manifest-nested-object": _h(
        "manifest.too_deep", lambda r: _write_manifest_text(r, '{"a":' * 50_000 + "1" + "}" * 50_000)
    ),
    "manifest-nested-unknown-field": _h("manifest.too_deep", _nested_unknown_field(MAX_MANIFEST_DEPTH + 5)),
    "manifest-huge": _h("manifest.too_large", _huge, f"{MAX_MANIFEST_BYTES:,}"),
    "manifest-fifo": _h("manifest.not_regular", lambda r: _replace_by("fifo")(r / MANIFEST_NAME), "FIFO"),
    "manifest-device": _h("manifest.not_regular", lambda r: _replace_by("device")(r / MANIFEST_NAME), "device"),
    "manifest-directory": _h("manifest.not_regular", lambda r: _replace_by("dir")(r / MANIFEST_NAME), "directory"),
    "manifest-symlink-loop": _h("file.symlink_loop", lambda r: _replace_by("loop")(r / MANIFEST_NAME)),
    "manifest-symlink-out": _h("file.path_escape", _symlink_out),
    "manifest-not-utf8": _h("manifest.unreadable", lambda r: _write_manifest_text(r, b'{"name": "\xff\xfe"}')),
    "manifest-lone-surrogate": _h("manifest.unreadable", _text_edit('"name": "testpkg"', '"name": "\\ud800"')),
    "manifest-5000-digit-integer": _h("manifest.unreadable", _text_edit('"lanes": 4', '"lanes": ' + "1" * 5000)),
    "manifest-nan": _h("value.range", _text_edit('"logit_atol": 0.05', '"logit_atol": NaN')),
    "manifest-infinity": _h("value.range", _text_edit('"h2d_gbps": 10.0', '"h2d_gbps": Infinity')),
    "manifest-minus-infinity": _h("value.range", _text_edit('"rope_theta": 10000.0', '"rope_theta": -Infinity')),
    "manifest-1e400": _h("value.range", _text_edit('"ms_per_token": 2.0', '"ms_per_token": 1e400')),
    "manifest-nan-logit": _h("value.range", _text_edit("3.5", "NaN")),
    "manifest-int-beyond-int64": _h("value.range", _text_edit('"lanes": 4', '"lanes": ' + str(2**63))),
    "file-fifo": _h("file.not_regular", lambda r: _replace_by("fifo")(r / "hparam.yaml"), "FIFO"),
    "file-device": _h("file.not_regular", lambda r: _replace_by("device")(r / "hparam.yaml"), "device"),
    "file-directory": _h("file.not_regular", lambda r: _replace_by("dir")(r / "hparam.yaml"), "directory"),
    "file-symlink-loop": _h("file.symlink_loop", lambda r: _replace_by("loop")(r / "hparam.yaml")),
    "folder-symlink-loop": _h({"file.symlink_loop", "file.extra"}, _loop_folder),
    "extra-fifo": _h("file.extra", _extra_fifo, "pipe"),
    "folders-1200-deep": _h("file.extra", _deep_folders),
    "chat-template-nested": _h("tokenizer.chat_template", _nested_template, "deep"),
}


@pytest.mark.timeout(60)  # a FIFO opened for reading would block forever
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_each_hostile_package_gets_its_code(factory: PackageFactory, name: str) -> None:
    hostile = HOSTILE[name]
    root = factory.write()
    hostile.change(root)
    report = validate_package(root)
    assert set(report.codes) == hostile.codes, report.render_text()
    assert not report.ok
    if hostile.expect_in_message:
        assert any(hostile.expect_in_message in p.message for p in report.problems), report.render_text()


def test_new_codes_are_errors() -> None:
    for code in ("manifest.too_deep", "manifest.too_large", "manifest.not_regular", "file.symlink_loop"):
        assert CODES[code][0].value == "error"


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_no_float_field_takes_a_non_finite_number(factory: PackageFactory, value: str) -> None:
    """Every float of the schema: NaN compares false (a NaN golden logit matched anything) and an
    infinite timing figure would stall calsim; JSON has neither."""
    root = factory.write()
    base = valid_manifest().to_dict()
    floats = [p for p in _leaf_paths(base) if isinstance(_get(base, p), float)]
    assert len(floats) > 10
    for path in floats:
        text = json.dumps(_set(base, path, "@@")).replace('"@@"', value)
        _write_manifest_text(root, text)
        report = validate_package(root)
        assert report.codes == ["value.range"], (path, report.render_text())
        assert report.problems[0].where == "manifest." + ".".join(
            f"{k}" if isinstance(k, str) else f"[{k}]" for k in path
        ).replace(".[", "[")


def test_no_integer_field_takes_a_number_beyond_64_bits(factory: PackageFactory) -> None:
    """Capacity arithmetic used to overflow floats (OverflowError) on 4,000-digit sizes."""
    root = factory.write()
    base = valid_manifest().to_dict()
    ints = [p for p in _leaf_paths(base) if type(_get(base, p)) is int and p != ("schema_version",)]
    assert len(ints) > 30
    for big in (2**63, -(2**63) - 1, 10**4200):
        for path in ints:
            _write_manifest_text(root, json.dumps(_set(base, path, big)))
            report = validate_package(root)
            assert report.codes == ["value.range"], (path, report.render_text())
            assert len(report.problems[0].message) < 200


def test_int64_bounds_themselves_are_structurally_fine(factory: PackageFactory) -> None:
    root = factory.write()
    _write_manifest_text(root, json.dumps(_set(valid_manifest().to_dict(), ("synthetic_seed",), 2**63 - 1)))
    assert validate_package(root).ok


def test_the_depth_cap_leaves_room_for_the_schema(factory: PackageFactory) -> None:
    root = factory.write()
    _nested_unknown_field(MAX_MANIFEST_DEPTH - 2)(root)
    assert validate_package(root).codes == ["schema.unknown_field"]


def test_a_manifest_at_the_size_cap_is_read(factory: PackageFactory) -> None:
    root = factory.write()
    text = _raw_text(root)
    _write_manifest_text(root, text + " " * (MAX_MANIFEST_BYTES - len(text.encode())))
    assert validate_package(root).ok


def test_a_symlinked_package_root_is_validated_through_the_link(factory: PackageFactory) -> None:
    root = factory.write()
    link = root.parent / "link-to-pkg"
    os.symlink(root, link)
    report = validate_package(link)
    assert report.ok and report.problems == ()


def test_a_package_root_that_is_a_symlink_loop_is_reported(factory: PackageFactory) -> None:
    loop = factory.base / "loop"
    os.symlink("loop", loop)
    report = validate_package(loop)
    assert [(p.code, p.where) for p in report.problems] == [("file.symlink_loop", ".")]


def test_calctl_capacity_reads_through_the_same_guards(factory: PackageFactory) -> None:
    root = factory.write()
    _write_manifest_text(root, "[" * 100_000 + "]" * 100_000)
    with pytest.raises(ManifestError) as info:
        load_manifest(root)
    assert info.value.code == "manifest.too_deep"


# ---------------------------------------------------------------- permission denied


@pytest.fixture
def open_base() -> Iterator[Path]:
    """A temp folder `nobody` can traverse (pytest's own is 0700 under root)."""
    base = Path(tempfile.mkdtemp(prefix="calculet-perm-"))
    base.chmod(0o755)
    yield base
    for path in base.rglob("*"):
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)
    shutil.rmtree(base)


def _validate_without_privileges(root: Path, verify_hashes: bool = True) -> list[str]:
    """Codes of `validate_package(root)` run as a user that file permissions apply to: in-process
    when not root, else in a forked child that drops to `nobody` first (root reads anything)."""
    if os.geteuid() != 0:
        return validate_package(root, verify_hashes=verify_hashes).codes
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: drop privileges, validate, report the codes, exit without pytest's teardown
        try:
            os.close(read_fd)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            out = json.dumps(validate_package(root, verify_hashes=verify_hashes).codes)
        except BaseException as exc:
            out = json.dumps({"exception": f"{type(exc).__name__}: {exc}"})
        os.write(write_fd, out.encode())
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        data = json.loads(f.read())
    os.waitpid(pid, 0)
    assert isinstance(data, list), data
    return data


def _perm_package(base: Path) -> Path:
    root = PackageFactory(base).write()
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


@pytest.mark.parametrize("verify_hashes", [True, False])
def test_unreadable_chat_template_file_is_reported_not_raised(open_base: Path, verify_hashes: bool) -> None:
    root = _perm_package(open_base)
    text = b"{% for m in messages %}{{ m.content }}{% endfor %}"
    (root / "tokenizer" / "chat.jinja").write_bytes(text)
    raw = json.loads(_raw_text(root))
    raw["files"].append({"path": "tokenizer/chat.jinja", "size": len(text), "sha256": _sha(text), "role": "tokenizer"})
    raw["tokenizer"]["chat_template"] = "tokenizer/chat.jinja"
    _write_manifest_text(root, json.dumps(raw))
    (root / "tokenizer" / "chat.jinja").chmod(0)
    codes = _validate_without_privileges(root, verify_hashes)
    assert codes == (["file.unreadable"] if verify_hashes else ["tokenizer.chat_template"])


def test_unreadable_manifest_is_reported(open_base: Path) -> None:
    root = _perm_package(open_base)
    (root / MANIFEST_NAME).chmod(0)
    assert _validate_without_privileges(root) == ["manifest.unreadable"]


def test_unreadable_listed_file_is_reported(open_base: Path) -> None:
    root = _perm_package(open_base)
    (root / "hparam.yaml").chmod(0)
    assert _validate_without_privileges(root) == ["file.unreadable"]


def test_unlistable_folder_is_reported(open_base: Path) -> None:
    root = _perm_package(open_base)
    (root / "decode").chmod(0)
    assert set(_validate_without_privileges(root)) == {"file.unreadable"}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------- calctl package validate


CLI_CASES = [
    "manifest-nested-array",
    "manifest-huge",
    "manifest-fifo",
    "manifest-symlink-loop",
    "manifest-nan",
    "file-symlink-loop",
    "chat-template-nested",
    "folders-1200-deep",
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", CLI_CASES)
def test_calctl_package_validate_exits_1_with_the_code(
    factory: PackageFactory, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = HOSTILE[name]
    root = factory.write()
    hostile.change(root)
    assert main(["package", "validate", "--json", str(root)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert {p["code"] for p in report["problems"]} == hostile.codes


def test_calctl_package_validate_on_a_symlink_loop_root_exits_1(
    factory: PackageFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    loop = factory.base / "loop"
    os.symlink("loop", loop)
    assert main(["package", "validate", str(loop)]) == 1
    assert "file.symlink_loop" in capsys.readouterr().out


def test_calctl_package_validate_process_prints_no_traceback(factory: PackageFactory) -> None:
    root = factory.write()
    _write_manifest_text(root, "[" * 100_000 + "]" * 100_000)
    proc = subprocess.run(
        [sys.executable, "-m", "calculet.ops.calctl", "package", "validate", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert "manifest.too_deep" in proc.stdout
    assert "Traceback" not in proc.stderr and proc.stderr == ""


# ---------------------------------------------------------------- the daemon's Load, in process


@pytest.fixture(scope="module")
def hostile_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A models root with the tiny package and hostile copies of it (the daemon's view)."""
    root = tmp_path_factory.mktemp("models")
    build_sim_package("tiny", root / "tiny")
    return root


DAEMON_CASES = [
    "manifest-nested-array",
    "manifest-huge",
    "manifest-fifo",
    "manifest-symlink-loop",
    "manifest-lone-surrogate",
    "manifest-nan",
    "file-symlink-loop",
    "chat-template-nested",
]


def _hostile_copy(models: Path, name: str) -> str:
    """`models/<name>`: the test factory's valid package broken by HOSTILE[name]."""
    factory = PackageFactory(models / "_factory")
    (models / "_factory").mkdir(exist_ok=True)
    root = factory.write()
    HOSTILE[name].change(root)
    target = models / name
    root.rename(target)
    return name


@pytest.mark.timeout(120)
def test_the_daemon_refuses_each_hostile_package_with_its_code(hostile_root: Path) -> None:
    with running_core(hostile_root) as core:
        for name in DAEMON_CASES:
            path = _hostile_copy(hostile_root, name)
            with pytest.raises(FailedPrecondition) as info:
                core.load("bad", path)
            assert any(code in str(info.value) for code in HOSTILE[name].codes), (name, str(info.value))
            assert len(str(info.value)) < 4096
        os.symlink("loop", hostile_root / "loop")
        with pytest.raises(FailedPrecondition, match=r"file\.symlink_loop"):
            core.load("bad", "loop")
        assert core.models.published("bad") is None
        assert core.load("good", "tiny").alias == "good", "the daemon still loads a valid package"


def test_the_load_message_is_bounded_however_many_problems(hostile_root: Path) -> None:
    """10,000 missing files with 200-character names: the error names the first few, then a count."""
    factory = PackageFactory(hostile_root / "_many")
    (hostile_root / "_many").mkdir(exist_ok=True)
    root = factory.write()
    raw = json.loads(_raw_text(root))
    name = "x" * 200
    raw["files"] += [{"path": f"{name}{i}", "size": 1, "sha256": "0" * 64, "role": "metadata"} for i in range(10_000)]
    _write_manifest_text(root, json.dumps(raw))
    root.rename(hostile_root / "many")
    with running_core(hostile_root) as core, pytest.raises(FailedPrecondition) as info:
        core.load("bad", "many")
    message = str(info.value)
    assert "file.missing" in message and "more" in message
    assert len(message) < 4096


def _leaf_paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _leaf_paths(v, (*prefix, k))]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _leaf_paths(v, (*prefix, i))]
    return [prefix]


def _get(node: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        node = node[key]
    return node


def _set(base: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    raw = json.loads(json.dumps(base))
    _get(raw, path[:-1])[path[-1]] = value
    return raw


def test_the_factory_files_are_what_the_cases_assume() -> None:
    assert "hparam.yaml" in FILES and "prefill/ccu0_chip0.elf" in FILES
