"""`calctl install-units [--prefix /] [--bin DIR] [--units DIR]`: install the systemd units.

Copies the repository's `systemd/` files: `calculet-daemon@.service`, `calculet-gateway.service` and
`calculet.target` into `<prefix>/etc/systemd/system/` (replacing earlier copies), `calculet.sysusers`
as `<prefix>/etc/sysusers.d/calculet.conf` (the `calculet` service user), and the example configs
`daemon.toml` and `gateway.toml` into `<prefix>/etc/calculet/` unless a file of that name is there
already (an operator's config is never overwritten). Each service's ExecStart= runs the installed
command: `calculet-daemon` / `calculet-gateway` in --bin DIR, else next to this Python (a
virtualenv's bin/), else on PATH, else `python -m` with this Python. Then it prints the systemctl
commands to run. `make install-units` runs it.

Exit codes: 0 installed, 1 a file could not be written, 2 usage (no unit files, no command in --bin).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from pathlib import Path

COMMAND = ("install-units",)
HELP = "Install the systemd units (calculet.target, calculet-daemon@.service, the gateway) and example configs."
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

UNITS_SOURCE = Path(__file__).resolve().parents[2] / "systemd"  # the repository's systemd/ folder
UNITS = ("calculet-daemon@.service", "calculet-gateway.service", "calculet.target")
CONFIGS = ("daemon.toml", "gateway.toml")
SYSUSERS = ("calculet.sysusers", "calculet.conf")  # source name, name in <prefix>/etc/sysusers.d/
# The commands ExecStart= may name: command -> its module (for the `python -m` fallback).
COMMANDS = {"calculet-daemon": "calculet.daemon.main", "calculet-gateway": "calculet.gateway.main"}
HIDDEN_BY_PROTECT_HOME = ("/home/", "/root/", "/run/user/")  # ProtectHome=true in the units
_EXEC_START = re.compile(r"^(ExecStart=)(\S+)(.*)$", re.MULTILINE)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prefix", type=Path, default=Path("/"), help="install under this root (default /)")
    parser.add_argument(
        "--bin",
        type=Path,
        metavar="DIR",
        help="directory holding calculet-daemon and calculet-gateway (default: next to this Python, else PATH)",
    )
    parser.add_argument(
        "--units", type=Path, default=UNITS_SOURCE, metavar="DIR", help=f"files to install (default {UNITS_SOURCE})"
    )


def resolve_command(name: str, bin_dir: Path | None = None) -> list[str]:
    """The argv that runs `name` (a key of COMMANDS), absolute.

    Raises:
        FileNotFoundError: `bin_dir` is given and holds no executable `name`.
    """
    if bin_dir is not None:
        path = Path(os.path.abspath(bin_dir / name))
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise FileNotFoundError(f"--bin {bin_dir}: no executable {name} there")
        return [str(path)]
    beside = Path(os.path.abspath(sys.executable)).parent / name  # not resolved: a venv's python is a symlink
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    found = shutil.which(name)
    if found:
        return [os.path.abspath(found)]
    return [os.path.abspath(sys.executable), "-m", COMMANDS[name]]


def systemd_word(word: str) -> str:
    """`word` as one word of a systemd command line: '%' and '$' escaped, quoted if it has blanks."""
    word = word.replace("%", "%%").replace("$", "$$")
    if re.search(r"[\s\"'\\;]", word):
        return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return word


def rewrite_exec_start(text: str, commands: dict[str, list[str]]) -> str:
    """`text` with the program of each ExecStart= that names a command of `commands` (by its base
    name) replaced by that command's argv; arguments and other lines unchanged."""

    def replace(m: re.Match[str]) -> str:
        argv = commands.get(Path(m.group(2)).name)
        return m.group(0) if argv is None else m.group(1) + " ".join(map(systemd_word, argv)) + m.group(3)

    return _EXEC_START.sub(replace, text)


def install_units(source: Path, prefix: Path, commands: dict[str, list[str]]) -> list[str]:
    """Install from `source` under `prefix` (see the module docstring). Returns one line per file.

    Raises:
        FileNotFoundError: a source file is missing.
        OSError: a file cannot be written.
    """
    units_dir = prefix / "etc" / "systemd" / "system"
    config_dir = prefix / "etc" / "calculet"
    sysusers_dir = prefix / "etc" / "sysusers.d"
    for name in (*UNITS, *CONFIGS, SYSUSERS[0]):
        if not (source / name).is_file():
            raise FileNotFoundError(f"{source / name}: missing (pass --units DIR, the repository's systemd/)")
    report = []
    for name in UNITS:
        _write(units_dir / name, rewrite_exec_start((source / name).read_text(encoding="utf-8"), commands))
        report.append(f"installed {units_dir / name}")
    _write(sysusers_dir / SYSUSERS[1], (source / SYSUSERS[0]).read_text(encoding="utf-8"))
    report.append(f"installed {sysusers_dir / SYSUSERS[1]}")
    config_dir.mkdir(parents=True, exist_ok=True)
    for name in CONFIGS:
        try:
            with (config_dir / name).open("x", encoding="utf-8") as f:  # never over an operator's file
                f.write((source / name).read_text(encoding="utf-8"))
        except FileExistsError:
            report.append(f"kept {config_dir / name} (exists; the example is {source / name})")
            continue
        (config_dir / name).chmod(0o644)
        report.append(f"installed {config_dir / name}")
    return report


def _write(path: Path, text: str) -> None:
    """Replace `path` with `text` (mode 0644) in one step: a reader sees the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.chmod(0o644)
    os.replace(tmp, path)


def run(args: argparse.Namespace) -> int:
    try:
        commands = {name: resolve_command(name, args.bin) for name in COMMANDS}
    except FileNotFoundError as exc:
        print(f"calctl install-units: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        report = install_units(args.units, args.prefix, commands)
    except FileNotFoundError as exc:
        print(f"calctl install-units: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"calctl install-units: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print("\n".join(report))
    for name, argv in commands.items():
        print(f"ExecStart of {name}: {' '.join(argv)}")
        if argv[0].startswith(HIDDEN_BY_PROTECT_HOME):
            print(f"warning: {argv[0]} is under a home directory, which ProtectHome=true hides", file=sys.stderr)
    where = "" if args.prefix.resolve() == Path("/") else f" (after copying {args.prefix}/etc into /etc)"
    print(f"next{where}:\n  systemd-sysusers && systemctl daemon-reload && systemctl enable --now calculet.target")
    return EXIT_OK
