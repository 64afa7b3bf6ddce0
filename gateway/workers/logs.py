"""Which worker wrote a log line: in a worker, every record's logger name gets `[worker I]`
(`calculet.gateway.board[worker 1]: ...`, and the `logger` field of JSON lines), so the workers'
interleaved lines in one journal stay apart. uvicorn's own lines carry the pid instead."""

from __future__ import annotations

import logging


class WorkerLogTag(logging.Filter):
    """Appends `[worker INDEX]` to each record's logger name, once per record."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.suffix = f"[worker {index}]"

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.endswith(self.suffix):
            record.name += self.suffix
        return True


def tag_worker_logs(index: int) -> None:
    """Tag every record the root logger's handlers write (call after `setup_logging`)."""
    tag = WorkerLogTag(index)
    for handler in logging.getLogger().handlers:
        handler.addFilter(tag)
