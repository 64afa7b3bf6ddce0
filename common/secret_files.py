"""Files that hold secrets one a line (API keys, bearer tokens): read by the gateway's settings and by
calctl and the bench, which send them. One reader, so both ends accept the same files."""

from __future__ import annotations

from pathlib import Path

from calculet.common.errors import InvalidArgument


def read_secret_lines(path: Path, what: str, noun: str = "key") -> tuple[str, ...]:
    """The non-blank lines of `path` that are not `#` comments, stripped.

    Raises:
        InvalidArgument: the file cannot be read, holds none, or one is not printable ASCII
            without spaces (it could never travel in a header); `what` names the setting, `noun`
            what one line holds.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise InvalidArgument(f"{what} {path}: cannot be read: {reason}") from None
    secrets = []
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        if not all("!" <= ch <= "~" for ch in text):
            raise InvalidArgument(f"{what} {path}: line {number} is not printable ASCII without spaces")
        secrets.append(text)
    if not secrets:
        raise InvalidArgument(f"{what} {path}: holds no {noun} (one a line; blank lines and # comments are ignored)")
    return tuple(secrets)
