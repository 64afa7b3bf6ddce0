"""Log lines for the daemon and the gateway: text (default) or one JSON object a line.

`setup_logging(level, fmt)` configures the root logger once at start and again on a reload.
`--log-format json` writes `{"ts", "level", "logger", "message", ...}` with orjson, plus every
field a call passed in `extra=` that is one of `CONTEXT_FIELDS` (the request id, the job id, the
model), so a log shipper can index them. Text lines carry the same ids inside the message: each
call site writes them there too, which keeps both formats greppable by request id.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson

from calculet.common.errors import InvalidArgument

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CONTEXT_FIELDS = ("request_id", "job_id", "model", "board")


class JsonFormatter(logging.Formatter):
    """One JSON object per record (UTC timestamps with milliseconds, exceptions as text)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value not in (None, ""):
                out[name] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def setup_logging(level: str, fmt: str = "text") -> None:
    """Configure the root logger's level and its one stream handler's format.

    Raises:
        InvalidArgument: an unknown format.
    """
    if fmt not in LOG_FORMATS:
        raise InvalidArgument(f"log_format: must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.StreamHandler())
    formatter = JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT)
    for handler in root.handlers:
        handler.setFormatter(formatter)
    root.setLevel(level)
