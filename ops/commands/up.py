"""`calctl up`: a local fleet in the foreground, N calsim board daemons behind the gateway.

Owns the command's arguments, the calsim package under `<dir>/models/<preset>` (built when
missing, always validated), the defaults derived from it (the policy when `--policy` is auto, the
daemons' job timeout: `calculet.ops.serving_defaults`), the banner (base URL, a curl and an
`openai` snippet, where the logs are), the foreground watch (reporting children that die) and
the signals: Ctrl-C, SIGTERM or SIGHUP stop the fleet (gateway first, then the boards); a second
one skips the rest of the grace period. The processes themselves belong to `calculet.ops.fleet.LocalFleet`.

Exit codes: 0 after a requested stop, 1 when startup failed or was interrupted (everything
started is stopped) or the gateway died, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import select
import shlex
import signal
import sys
import types
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from calculet.common.errors import CalculetError
from calculet.daemon.package.manifest import MANIFEST_NAME, load_manifest
from calculet.daemon.package.validate import validate_package
from calculet.ops.fleet import GATEWAY_MODULE, FleetConfig, FleetError, LocalFleet, gateway_argv
from calculet.ops.serving_defaults import CONTINUOUS, SERIAL, ServingDefaults, serving_defaults
from calculet.ops.sim_packages import PRESETS, build_sim_package

COMMAND = ("up",)
HELP = "Run a local fleet in the foreground: N calsim board daemons behind the OpenAI-compatible gateway."
EXIT_OK, EXIT_FAILED = 0, 1
MAX_BOARDS = 64
WATCH_S = 1.0  # longest sleep of the foreground watch when no signal arrives
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Flags the fleet sets itself (fleet.py): an extra argument may not repeat them (the later one would
# win and break the fleet: another socket, another model, another time scale than the banner says).
DAEMON_OWN_FLAGS = ("--board", "--listen", "--runtime-dir", "--models-root", "--model", "--time-scale", "--policy")
GATEWAY_OWN_FLAGS = ("--listen", "--daemon")
AUTO = "auto"  # --policy: derived from the packages (`serving_defaults`)


# ---------------------------------------------------------------- arguments


def board_count(text: str) -> int:
    """argparse type. Raises argparse.ArgumentTypeError unless `text` is an integer in 1..MAX_BOARDS."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer") from None
    if not 1 <= value <= MAX_BOARDS:
        raise argparse.ArgumentTypeError(f"{value}: must be between 1 and {MAX_BOARDS}")
    return value


def port_number(text: str) -> int:
    """argparse type. Raises argparse.ArgumentTypeError unless `text` is a TCP port, 1..65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a port number") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value}: must be between 1 and 65535")
    return value


def time_scale(text: str) -> float:
    """argparse type. Raises argparse.ArgumentTypeError unless `text` is a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text}: must be a finite number >= 0")
    return value


def seconds(text: str) -> float:
    """argparse type. Raises argparse.ArgumentTypeError unless `text` is a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text}: must be a finite number of seconds > 0")
    return value


def host_name(text: str) -> str:
    """argparse type. Raises argparse.ArgumentTypeError for an empty host or one with spaces."""
    if not text or any(ch.isspace() for ch in text):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a host name or address")
    return text


def extra_args(role: str, own_flags: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    """argparse type of `--daemon-arg` / `--gateway-arg`: one value, split like a shell would
    (`--daemon-arg '--prefix-reuse on'` or `--daemon-arg=--prefix-reuse=on`), into flags for every
    `role` process.

    Raises (when called):
        argparse.ArgumentTypeError: the value is empty or unbalanced, does not start with a flag,
            or names a flag of `own_flags` (the fleet sets those itself).
    """

    def parse(text: str) -> tuple[str, ...]:
        try:
            words = tuple(shlex.split(text))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
        if not words:
            raise argparse.ArgumentTypeError(f"{text!r}: expected {role} flags, e.g. '--log-level DEBUG'")
        if not words[0].startswith("-"):
            raise argparse.ArgumentTypeError(f"{text!r}: expected {role} flags, starting with '--'")
        for word in words:
            name = word.partition("=")[0]
            if name in own_flags:
                raise argparse.ArgumentTypeError(
                    f"{text!r}: {name} is set by calctl up itself for every {role} ({', '.join(own_flags)})"
                )
        return words

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--boards", type=board_count, required=True, metavar="N", help="calsim boards (daemons) to run")
    models = parser.add_mutually_exclusive_group(required=True)
    models.add_argument("--preset", choices=sorted(PRESETS), help="model package each board serves")
    models.add_argument(
        "--models",
        type=preset_list,
        metavar="A,B[,...]",
        help="several presets: the boards start on the first, the gateway's catalog holds all (docs/models.md)",
    )
    parser.add_argument("--port", type=port_number, default=8000, help="gateway port (8000)")
    parser.add_argument("--host", type=host_name, default="127.0.0.1", help="gateway address (127.0.0.1)")
    parser.add_argument(
        "--time-scale",
        type=time_scale,
        default=1.0,
        metavar="F",
        help="calsim wall seconds per modelled second; 1 = the board's speed, 0 = never sleep (1)",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path("run"),
        help="working directory: models/, board<i>.sock, logs/, the board locks and calsim/ (run)",
    )
    parser.add_argument(
        "--policy",
        default=AUTO,
        choices=(AUTO, CONTINUOUS, SERIAL),
        help="daemon scheduling; auto: serial for packages of one KV lane, else continuous (auto)",
    )
    parser.add_argument(
        "--startup-timeout", type=seconds, default=120.0, metavar="S", help="seconds to wait for readiness (120)"
    )
    parser.add_argument(
        "--daemon-arg",
        type=extra_args("daemon", DAEMON_OWN_FLAGS),
        action="append",
        default=[],
        metavar="FLAGS",
        help="extra flags for every daemon, shell-split, repeatable (e.g. --daemon-arg '--prefix-reuse on')",
    )
    parser.add_argument(
        "--gateway-arg",
        type=extra_args("gateway", GATEWAY_OWN_FLAGS),
        action="append",
        default=[],
        metavar="FLAGS",
        help="extra flags for the gateway, shell-split, repeatable (e.g. --gateway-arg '--routing prefix')",
    )
    # Tests run a stand-in gateway module; operators have no reason to change it.
    parser.add_argument("--gateway-module", default=GATEWAY_MODULE, help=argparse.SUPPRESS)


def preset_list(text: str) -> tuple[str, ...]:
    """argparse type: comma-separated distinct preset names. Raises argparse.ArgumentTypeError."""
    names = tuple(name.strip() for name in text.split(","))
    unknown = [name for name in names if name not in PRESETS]
    if unknown or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected distinct presets of {', '.join(sorted(PRESETS))}, comma-separated"
        )
    return names


def catalog_toml(models: Sequence[str]) -> str:
    """The gateway config holding the catalog of `models` (alias and package are the preset names;
    the first, which every board starts on, keeps at least one board), with placement by demand."""
    lines = [
        "# written by calctl up --models: the gateway's model catalog and placement (docs/models.md)",
        "[gateway]",
        'placement = "demand"  # a request for a model no board serves switches a board to it',
    ]
    for i, name in enumerate(models):
        lines += ["", f"[gateway.models.{json.dumps(name)}]", f"package = {json.dumps(name)}"]
        if i == 0:
            lines.append("min-boards = 1")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- package


def ensure_package(models_root: Path, preset: str, say: Callable[[str], None] = print) -> Path:
    """Build the calsim package `models_root/preset` unless it has a manifest, then validate it.

    Args:
        models_root: the daemons' models root.
        preset: a `calculet.ops.sim_packages.PRESETS` name.
        say: progress output.

    Returns:
        The package directory.

    Raises:
        FleetError: the build failed or the package is invalid (with the validator's report).
    """
    out = models_root / preset
    if not (out / MANIFEST_NAME).exists():
        say(f"== building calsim package {preset} -> {out}")
        try:
            build_sim_package(preset, out, force=True)
        except CalculetError as exc:
            raise FleetError(f"building {preset} into {out} failed: {exc.kind.value}: {exc}") from None
    say(f"== validating {out}")
    report = validate_package(out)
    if not report.ok:
        raise FleetError(f"package {out} is invalid:\n{report.render_text()}")
    for w in report.warnings:  # loadable; what the validator adjusted or found suspicious
        say(f"   warning {w.code}: {w.message}")
    return out


# ---------------------------------------------------------------- banner


def switch_hint(first: str, others: Sequence[str], target: str) -> str:
    """How to serve one of `others` (loadable in the gateway's catalog): ask for it (placement by
    demand switches a board), or switch a board by hand."""
    lines = [
        f"Loadable (in the gateway's catalog, GET /v1/models): {', '.join(others)}. Ask for one and the gateway",
        f"switches a board to it (placement by demand; {first} keeps one board). Or switch a board by hand:",
    ]
    lines += [f"  calctl load {name} {name} --switch-from {first}@1 --daemon {target}" for name in others]
    return "\n".join(lines)


def banner(base_url: str, model: str, targets: Sequence[str], log_dir: Path, python: str | None = None) -> str:
    """What `calctl up` prints once the fleet is ready: base URL, curl, openai snippet, boards, logs.

    Args:
        base_url: `http://HOST:PORT` of the gateway.
        model: the alias the boards serve.
        targets: the boards' gRPC targets.
        log_dir: where the children's logs are.
        python: interpreter shown in the snippet (default: this one).

    Returns:
        Multi-line text; the curl and the Python snippet paste as they are.
    """
    api = f"{base_url}/v1"
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 32})
    curl = f"curl -sS {api}/chat/completions -H 'Content-Type: application/json' \\\n    -d {shlex.quote(body)}"
    snippet = "\n".join(
        [
            f"{shlex.quote(python or sys.executable)} - <<'PY'",
            "from openai import OpenAI",
            f"client = OpenAI(base_url={api!r}, api_key='unused')",
            "stream = client.chat.completions.create(",
            f"    model={model!r},",
            "    messages=[{'role': 'user', 'content': 'Say hello.'}],",
            "    max_tokens=32,",
            "    stream=True,",
            ")",
            "for chunk in stream:",
            "    if chunk.choices and chunk.choices[0].delta.content:",
            "        print(chunk.choices[0].delta.content, end='', flush=True)",
            "print()",
            "PY",
        ]
    )
    boards = [f"  board{i}: {t}   (calctl status --daemon {t})" for i, t in enumerate(targets)]
    logs = ", ".join([*(f"board{i}.log" for i in range(len(targets))), "gateway.log"])
    return "\n".join(
        [
            f"Calculet: {len(targets)} calsim board(s) serving {model!r} behind the gateway",
            f"OpenAI base URL: {api}",
            "",
            "curl:",
            curl,
            "",
            "Python (openai):",
            snippet,
            "",
            "boards:",
            *boards,
            f"logs: {log_dir}/ ({logs})",
            "Stop with Ctrl-C (gateway first, then the boards drain and stop).",
            "",
        ]
    )


# ---------------------------------------------------------------- signals


class SignalWatch:
    """While entered: Ctrl-C, SIGTERM and SIGHUP request a stop (a second one: hurry), SIGCHLD wakes
    `wait`. Handlers only set flags; `wait` sleeps on the signal wakeup fd, so a signal ends it at
    once. Owns a pipe and the process's signal handlers until exit (main thread only)."""

    def __init__(self) -> None:
        self.stop_signal: int | None = None
        self.hurry = False
        self._read_fd = self._write_fd = -1
        self._old_handlers: dict[int, object] = {}
        self._old_wakeup_fd = -1

    def __enter__(self) -> SignalWatch:
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self._old_wakeup_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        for sig in STOP_SIGNALS:
            self._old_handlers[sig] = signal.signal(sig, self._on_stop)
        self._old_handlers[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, self._on_child)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]  # whatever signal.signal returned
        signal.set_wakeup_fd(self._old_wakeup_fd)
        os.close(self._read_fd)
        os.close(self._write_fd)

    def _on_stop(self, signum: int, frame: types.FrameType | None) -> None:
        if self.stop_signal is not None:
            self.hurry = True
        self.stop_signal = signum

    def _on_child(self, signum: int, frame: types.FrameType | None) -> None:
        """Nothing to do: the handler exists so SIGCHLD writes to the wakeup fd."""

    @property
    def stopping(self) -> bool:
        return self.stop_signal is not None

    def wait(self, timeout_s: float) -> None:
        """Sleep until a signal arrives or `timeout_s` passes."""
        if self.stopping:
            return
        readable, _, _ = select.select([self._read_fd], [], [], timeout_s)
        if readable:
            try:
                while os.read(self._read_fd, 512):
                    pass
            except BlockingIOError:
                pass


# ---------------------------------------------------------------- run


def _err(text: str) -> None:
    print(f"calctl up: {text}", file=sys.stderr, flush=True)


def _say(text: str) -> None:
    print(text, flush=True)


def presets_of(args: argparse.Namespace) -> tuple[str, ...]:
    """The presets `calctl up` serves: `--preset`'s, or `--models`' (the boards start on the first)."""
    return tuple(args.models) if args.models else (args.preset,)


def fleet_config(args: argparse.Namespace, derived: ServingDefaults | None = None) -> FleetConfig:
    """The fleet `calctl up` runs for these arguments (alias and package are the preset name). With
    several models, the gateway reads their catalog from `<dir>/gateway.toml` (written by `run`).
    `derived` (from the packages, `serving_defaults`) gives the policy when `--policy` is auto, and
    the daemons' `--job-timeout` unless a `--daemon-arg` sets it (without it: continuous, no flag)."""
    first = presets_of(args)[0]
    catalog = ("--config", str(args.dir / "gateway.toml")) if args.models else ()
    policy = args.policy if args.policy != AUTO else (derived.policy if derived else CONTINUOUS)
    extra = tuple(word for words in args.daemon_arg for word in words)
    timeout = ("--job-timeout", f"{derived.job_timeout_s:g}") if derived and not job_timeout_given(args) else ()
    return FleetConfig(
        workdir=args.dir,
        boards=args.boards,
        model=first,
        package=first,
        host=args.host,
        port=args.port,
        time_scale=args.time_scale,
        policy=policy,
        daemon_args=(*timeout, *extra),
        gateway_command=partial(gateway_argv, module=args.gateway_module),
        gateway_args=(*catalog, *(word for words in args.gateway_arg for word in words)),
    )


def job_timeout_given(args: argparse.Namespace) -> bool:
    """A `--daemon-arg` sets the daemons' `--job-timeout` (then calctl up derives none)."""
    return any(word.partition("=")[0] == "--job-timeout" for words in args.daemon_arg for word in words)


def derive_defaults(args: argparse.Namespace, packages: Sequence[Path]) -> ServingDefaults:
    """The policy (when `--policy` is auto) and job timeout for the packages served, from their
    manifests (`calculet.ops.serving_defaults`).

    Raises:
        FleetError: a manifest cannot be read.
    """
    try:
        manifests = [load_manifest(p) for p in packages]
    except CalculetError as exc:
        raise FleetError(f"reading the packages' manifests: {exc}") from None
    return serving_defaults(manifests, args.time_scale, None if args.policy == AUTO else args.policy)


def run(args: argparse.Namespace) -> int:
    try:
        packages = [ensure_package(args.dir / "models", preset, _say) for preset in presets_of(args)]
        derived = derive_defaults(args, packages)
        if args.policy == AUTO:
            _say(f"== policy {derived.policy} (auto: {derived.policy_reason})")
        if not job_timeout_given(args):
            _say(f"== job timeout {derived.job_timeout_s:g} s ({derived.job_timeout_reason})")
        if args.models:
            args.dir.mkdir(parents=True, exist_ok=True)
            (args.dir / "gateway.toml").write_text(catalog_toml(args.models), encoding="utf-8")
    except FleetError as exc:
        _err(str(exc))
        return EXIT_FAILED
    except OSError as exc:
        _err(f"cannot write {args.dir / 'gateway.toml'}: {exc}")
        return EXIT_FAILED
    fleet = LocalFleet(fleet_config(args, derived))
    with SignalWatch() as signals:
        try:
            return _serve(fleet, signals, args.startup_timeout, presets_of(args)[1:])
        finally:
            fleet.stop(hurry=lambda: signals.hurry)


def _serve(fleet: LocalFleet, signals: SignalWatch, startup_timeout_s: float, others: Sequence[str] = ()) -> int:
    """Start, print the banner (and how to switch a board to one of `others`), watch until a stop
    signal; the caller stops the fleet."""
    config = fleet.config
    _say(f"== starting {config.boards} calsim board(s) (policy {config.policy}, time scale {config.time_scale:g})")
    try:
        fleet.start(startup_timeout_s, cancelled=lambda: signals.stopping)
        _say(f"== boards SERVING; starting the gateway on {fleet.listen}")
        fleet.wait_ready(startup_timeout_s, cancelled=lambda: signals.stopping)
    except FleetError as exc:
        _err(f"startup failed: {exc}")
        _err("everything started was stopped")
        return EXIT_FAILED
    _say(banner(fleet.base_url, config.model, fleet.targets, fleet.log_dir))
    if others:
        _say(switch_hint(config.model, others, fleet.targets[0]))
    while not signals.stopping:
        signals.wait(WATCH_S)
        for ex in fleet.poll():
            if ex.role == "gateway":
                _err(f"the gateway stopped unexpectedly: {ex.describe()}")
                _err("stopping the boards")
                return EXIT_FAILED
            left = fleet.serving_boards()
            _err(f"{ex.describe()}\n{left} of {config.boards} board(s) still running")
    name = signal.Signals(signals.stop_signal).name if signals.stop_signal is not None else "stop"
    _say(f"== {name}: stopping the gateway, then the boards (again to skip the grace period)")
    killed = fleet.stop(hurry=lambda: signals.hurry)
    _say(f"== stopped ({'killed: ' + ', '.join(killed) if killed else 'all exited cleanly'})")
    return EXIT_OK
