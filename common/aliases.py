"""Model aliases as common.proto defines them: the one check the daemon and the gateway share."""

from __future__ import annotations

import re

from calculet.common.errors import InvalidArgument

# common.proto: model alias. Used with fullmatch: `$` would also match before a trailing newline.
ALIAS_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")


def check_alias(alias: str) -> None:
    """Refuse anything but a model alias as common.proto defines it (the whole string).

    Args:
        alias: the name a Load would publish.

    Raises:
        InvalidArgument: not 1-128 of A-Z a-z 0-9 . _ : / -, starting with a letter or digit (a
            trailing newline or any other control character included).
    """
    if not ALIAS_RE.fullmatch(alias):
        raise InvalidArgument(
            f"alias {alias[:200]!r}: use 1-128 of A-Z a-z 0-9 . _ : / -, starting with a letter or digit"
        )
