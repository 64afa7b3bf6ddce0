"""`calculet-gateway` entry point. The gateway (DESIGN.md section 7) is not built yet; the command
exists so the distribution's console scripts are complete, and it says so instead of pretending."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    print(
        "calculet-gateway: the OpenAI-compatible gateway is not built yet; "
        "talk to a board daemon directly with calctl or calculet.client.DaemonClient",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
