"""How calctl reaches a daemon: TLS and the bearer token; not a command itself (no COMMAND).

Owns: the `--tls-ca FILE`, `--tls-cert FILE`, `--tls-key FILE`, `--tls-server-name NAME` and
`--token-file FILE` arguments, their environment fallbacks (`CALCULET_TLS_CA`, `CALCULET_TLS_CERT`,
`CALCULET_TLS_KEY`, `CALCULET_TLS_SERVER_NAME`; the token from `CALCULET_TOKEN`), and the
`DaemonAccess` they make. The token is never a flag value: command lines are visible in `ps`.

TLS is on when a CA is given (flag or environment), and only then: a TCP daemon is dialled in
plaintext without one (a daemon listens on plain TCP only when started with --insecure). A client
certificate, key or server name without a CA is refused rather than silently ignored.

Data flow: argparse namespace + environment -> `access_from` (files read and checked once) ->
`DaemonAccess.client(target)` -> `calculet.client.DaemonClient`. Errors are the client's typed
`InvalidArgument` (the message names the flag or variable and the file), which `calctl.main`
prints as one line.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from calculet.client import DaemonClient, TlsConfig
from calculet.client.channel import call_metadata, read_tls
from calculet.common.errors import InvalidArgument
from calculet.common.secret_files import read_secret_lines

ENV_TOKEN = "CALCULET_TOKEN"
# dest -> (flag, environment variable)
TLS_SETTINGS: dict[str, tuple[str, str]] = {
    "tls_ca": ("--tls-ca", "CALCULET_TLS_CA"),
    "tls_cert": ("--tls-cert", "CALCULET_TLS_CERT"),
    "tls_key": ("--tls-key", "CALCULET_TLS_KEY"),
    "tls_server_name": ("--tls-server-name", "CALCULET_TLS_SERVER_NAME"),
}
ACCESS_FLAGS = (*(flag for flag, _ in TLS_SETTINGS.values()), "--token-file")
DEFAULT_TIMEOUT_S = 30.0


class StoreOnce(argparse.Action):
    """argparse action: store the value; a second occurrence is a usage error (exit 2), so that
    `calctl --tls-ca a status --tls-ca b` cannot silently use either."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        previous = getattr(namespace, self.dest, None)
        if previous is not None:
            parser.error(f"{option_string} given twice ({previous} and {values}); give it once")
        setattr(namespace, self.dest, values)


@dataclass(frozen=True)
class DaemonAccess:
    """What every daemon connection of one calctl run uses.

    Attributes:
        token: the bearer token (None = send none).
        tls: TLS settings (None = plaintext).
    """

    token: str | None = field(repr=False)
    tls: TlsConfig | None

    def client(self, target: str, timeout: float = DEFAULT_TIMEOUT_S) -> DaemonClient:
        """A client of `target`; the caller closes it.

        Raises:
            InvalidArgument: a bad target, or TLS files that cannot be read or are not PEM.
        """
        return DaemonClient(target, timeout=timeout, token=self.token, tls=self.tls)

    @property
    def plaintext(self) -> bool:
        return self.tls is None


def add_access_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("daemon access (TLS and token)")
    group.add_argument(
        "--tls-ca",
        action=StoreOnce,
        metavar="FILE",
        help="PEM CA that signed the daemon's certificate: dial with TLS (env CALCULET_TLS_CA). "
        "Without it a TCP daemon is dialled in plaintext (a daemon allows that only with --insecure)",
    )
    group.add_argument(
        "--tls-cert", action=StoreOnce, metavar="FILE", help="client certificate for mutual TLS (env CALCULET_TLS_CERT)"
    )
    group.add_argument("--tls-key", action=StoreOnce, metavar="FILE", help="its private key (env CALCULET_TLS_KEY)")
    group.add_argument(
        "--tls-server-name",
        action=StoreOnce,
        metavar="NAME",
        help="name the daemon's certificate must carry, when it is not the target's host "
        "(env CALCULET_TLS_SERVER_NAME)",
    )
    group.add_argument(
        "--token-file",
        action=StoreOnce,
        metavar="FILE",
        help=f"file holding the bearer token (first line that is not blank or a # comment); "
        f"default: env {ENV_TOKEN}. Use the operate token for load/unload/drain/resume/rollout",
    )


def access_from(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> DaemonAccess:
    """The token and TLS settings of this run: flags first, then the environment.

    Raises:
        InvalidArgument: a token file that cannot be read or holds no usable token; a bad
            CALCULET_TOKEN; a client certificate, key or server name without a CA; cert without
            key (or the reverse); a TLS file that cannot be read or is not PEM.
    """
    return DaemonAccess(token=_token(args, environ), tls=_tls(args, environ))


def _token(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    path = getattr(args, "token_file", None)
    if path is not None:
        return read_secret_lines(Path(path), "token-file", "token")[0]  # checked there: ASCII, no spaces
    token = environ.get(ENV_TOKEN) or None
    if token is not None:
        try:
            call_metadata(token)
        except InvalidArgument:
            raise InvalidArgument(f"{ENV_TOKEN}: the token must be printable ASCII without spaces") from None
    return token


def _tls(args: argparse.Namespace, environ: Mapping[str, str]) -> TlsConfig | None:
    given: dict[str, str] = {}
    for dest, (_flag, env) in TLS_SETTINGS.items():
        value = getattr(args, dest, None) or environ.get(env) or None
        if value is not None:
            given[dest] = value
    if not given:
        return None
    if "tls_ca" not in given:
        names = ", ".join(TLS_SETTINGS[dest][0] for dest in given)
        raise InvalidArgument(f"{names} given without --tls-ca (or CALCULET_TLS_CA): TLS needs the daemon's CA")
    tls = TlsConfig(
        ca_file=given["tls_ca"],
        cert_file=given.get("tls_cert"),
        key_file=given.get("tls_key"),
        server_name=given.get("tls_server_name"),
    )
    read_tls(tls)  # check the files now: one clear line before any daemon is dialled
    return tls
