"""Regenerate the Python code of the wire protocol from `protos/calculet/v1/*.proto`.

Owns: finding the proto sources, running `grpc_tools.protoc` (the pinned grpcio-tools) over them
and placing the outputs (`*_pb2.py`, `*_pb2.pyi`, `*_pb2_grpc.py`) next to the sources or under
`--out`. Data flow: proto root (include path 1; grpc_tools' bundled `_proto` dir with the
well-known types is include path 2) -> protoc into a scratch directory -> sync into the output
tree: changed files are written, identical ones left alone, and generated files no source
produces any more are removed, so the output tree holds exactly what the sources generate.

Run: `python -m calculet.ops.protogen [--protos DIR] [--out DIR]`.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import ModuleType

from calculet.common.errors import FailedPrecondition

# Where the sources live below the proto root; the import path `calculet/v1/x.proto` makes the
# generated code import `from calculet.v1 import x_pb2`.
PACKAGE_DIR = Path("calculet", "v1")
GENERATED_PATTERNS = ("*_pb2.py", "*_pb2.pyi", "*_pb2_grpc.py")


class ProtoGenError(FailedPrecondition):
    """The sources cannot be found, grpcio-tools is missing, or protoc rejected the sources."""


@dataclass
class SyncReport:
    """What `generate` did to the output tree (paths relative to it)."""

    written: list[Path] = field(default_factory=list)
    unchanged: list[Path] = field(default_factory=list)
    removed: list[Path] = field(default_factory=list)


def find_proto_root(explicit: Path | None = None) -> Path:
    """Return the directory that holds `calculet/v1/*.proto` (the include root).

    Looks, in order, at `explicit`, the source checkout this module sits in (`<repo>/protos`),
    then the directory of the installed `calculet.v1` package (which ships the .proto files).

    Raises:
        ProtoGenError: no candidate holds any `calculet/v1/*.proto` file.
    """
    candidates = [explicit] if explicit is not None else _default_candidates()
    for root in candidates:
        if _has_sources(root):
            return root.resolve()
    tried = ", ".join(str(c) for c in candidates) or "nothing"
    raise ProtoGenError(
        f"no {PACKAGE_DIR.as_posix()}/*.proto found under {tried}; run from a source checkout or pass --protos DIR"
    )


def proto_sources(root: Path) -> list[Path]:
    """The `.proto` files of the package, relative to `root`, sorted (protoc's input order)."""
    return sorted(p.relative_to(root) for p in (root / PACKAGE_DIR).glob("*.proto"))


def generated_files(tree: Path) -> list[Path]:
    """Generated files present under `tree/calculet/v1`, relative to `tree`, sorted."""
    folder = tree / PACKAGE_DIR
    found = {p for pattern in GENERATED_PATTERNS for p in folder.glob(pattern) if p.is_file()}
    return sorted(p.relative_to(tree) for p in found)


def run_protoc(root: Path, args: Sequence[str]) -> None:
    """Run the bundled protoc over every source under `root` with extra `args` (output flags).

    Raises:
        ProtoGenError: grpcio-tools is not installed, or protoc failed (its messages included).
    """
    protoc = _load_protoc()
    well_known = resources.files("grpc_tools") / "_proto"
    argv = [
        "grpc_tools.protoc",
        f"--proto_path={root}",
        f"--proto_path={well_known}",
        *args,
        *(p.as_posix() for p in proto_sources(root)),
    ]
    # protoc prints its diagnostics to fd 2 itself (C++), so the caller sees them above our error.
    code = protoc.main(argv)
    if code != 0:
        raise ProtoGenError(f"protoc failed with exit code {code} on the sources under {root} (see above)")


def generate(root: Path, out: Path) -> SyncReport:
    """Generate Python, stub and gRPC modules for every source under `root` into `out`.

    Args:
        root: include root holding `calculet/v1/*.proto`.
        out: output root; files land in `out/calculet/v1/`.

    Returns:
        Which generated files were written, left unchanged and removed as stale.

    Raises:
        ProtoGenError: as `run_protoc`.
    """
    with tempfile.TemporaryDirectory(prefix="protogen-") as scratch_name:
        scratch = Path(scratch_name)
        run_protoc(root, [f"--python_out={scratch}", f"--pyi_out={scratch}", f"--grpc_python_out={scratch}"])
        return _sync(scratch, out)


def descriptor_set(root: Path) -> bytes:
    """A serialized `FileDescriptorSet` of the sources with source info (comments), for checks.

    Raises:
        ProtoGenError: as `run_protoc`.
    """
    with tempfile.TemporaryDirectory(prefix="protogen-") as scratch_name:
        target = Path(scratch_name) / "descriptors.pb"
        run_protoc(root, [f"--descriptor_set_out={target}", "--include_source_info"])
        return target.read_bytes()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calculet.ops.protogen", description=__doc__)
    parser.add_argument("--protos", type=Path, help="include root holding calculet/v1/*.proto")
    parser.add_argument("--out", type=Path, help="output root (default: the include root)")
    args = parser.parse_args(argv)
    try:
        root = find_proto_root(args.protos)
        out = (args.out or root).resolve()
        report = generate(root, out)
    except ProtoGenError as exc:
        print(f"protogen: {exc}", file=sys.stderr)
        return 1
    for verb, paths in (("wrote", report.written), ("removed", report.removed)):
        for path in paths:
            print(f"{verb} {out / path}")
    print(f"{len(report.unchanged)} file(s) unchanged under {out / PACKAGE_DIR}")
    return 0


def _default_candidates() -> list[Path]:
    candidates = [Path(__file__).resolve().parent.parent / "protos"]
    spec = importlib.util.find_spec("calculet.v1")
    if spec is not None and spec.submodule_search_locations:
        # <root>/calculet/v1 -> <root>
        candidates += [Path(loc).parent.parent for loc in spec.submodule_search_locations]
    return candidates


def _has_sources(root: Path) -> bool:
    return root.is_dir() and any((root / PACKAGE_DIR).glob("*.proto"))


def _load_protoc() -> ModuleType:
    try:
        # by name: grpc_tools ships no type information, and a module object is all we need
        return importlib.import_module("grpc_tools.protoc")
    except ImportError as exc:
        raise ProtoGenError(
            f"grpcio-tools is not installed ({exc}); install the dev extras: pip install -e '.[dev]'"
        ) from None


def _sync(scratch: Path, out: Path) -> SyncReport:
    report = SyncReport()
    fresh = generated_files(scratch)
    for rel in fresh:
        data = (scratch / rel).read_bytes()
        target = out / rel
        if target.is_file() and target.read_bytes() == data:
            report.unchanged.append(rel)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        report.written.append(rel)
    for rel in sorted(set(generated_files(out)) - set(fresh)):
        (out / rel).unlink()
        report.removed.append(rel)
    return report


if __name__ == "__main__":
    raise SystemExit(main())
