"""calctl reads each command's words and help from its module's source and imports only the command
that runs: the specs match the modules, every command still parses, and a quick command does not
import the heavy ones."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import calculet.ops.commands as commands_pkg
from calculet.ops.calctl import build_parser, command_specs


def test_the_words_and_help_read_from_the_sources_are_the_modules_own() -> None:
    specs = command_specs()
    assert len(specs) >= 15 and len({s.words for s in specs}) == len(specs)
    for spec in specs:
        mod = importlib.import_module(spec.module)
        assert (tuple(mod.COMMAND), mod.HELP) == (spec.words, spec.help), spec.module


def test_every_module_with_a_command_has_its_spec_and_no_helper_has_one() -> None:
    modules = [f"{commands_pkg.__name__}.{m.name}" for m in pkgutil.iter_modules(commands_pkg.__path__)]
    with_command = {name for name in modules if hasattr(importlib.import_module(name), "COMMAND")}
    assert {spec.module for spec in command_specs()} == with_command
    assert len(modules) > len(with_command)  # helpers exist, and are skipped without an import


def test_a_parser_built_for_one_command_parses_it_as_the_full_parser_does() -> None:
    for words, flags in ((["health"], ["--daemon", "unix:/x.sock", "--json"]), (["bench", "suite"], ["--dir", "d"])):
        argv = words + flags
        lazy, full = vars(build_parser(argv).parse_args(argv)), vars(build_parser().parse_args(argv))
        assert lazy.pop("_parser").prog == full.pop("_parser").prog == " ".join(["calctl", *words])
        assert lazy == full, argv


def test_a_quick_command_imports_neither_the_soak_nor_the_bench() -> None:
    probe = (
        "import sys\n"
        "from calculet.ops.calctl import main\n"
        "code = main(['health', '--daemon', 'unix:/nonexistent/board.sock'])\n"
        "heavy = ('calculet.ops.soak.run', 'calculet.ops.bench.limit', 'openai', 'httpx', 'calculet.gateway')\n"
        "heavy = [m for m in heavy if m in sys.modules]\n"
        "print(code, heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "1 []", out
