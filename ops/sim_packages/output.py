"""Where a package build lands: refuse a non-empty OUT unless forced, build beside it, swap in.

`StagedOutput` owns the output path during a build. The check runs at construction, before any
work, so a refused build changes nothing. The build writes into a fresh staging directory
next to OUT (same filesystem, so the final rename is atomic); only a complete package replaces
OUT, and a failed build removes its staging directory and leaves OUT as it was.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from types import TracebackType

from calculet.common.errors import FailedPrecondition


class StagedOutput:
    """Context manager: `with StagedOutput(out, force) as staging:` build into `staging`.

    Args:
        out: the package directory to produce.
        force: replace an existing non-empty `out` (its whole contents are removed).

    Raises:
        FailedPrecondition: `out` is a symlink or not a directory, or is a non-empty directory
            and `force` is false.
    """

    def __init__(self, out: Path, force: bool) -> None:
        self.out = Path(out).absolute()
        self.force = force
        self._staging: Path | None = None
        if self.out.is_symlink():
            raise FailedPrecondition(f"{self.out}: is a symlink; give the real directory")
        if self.out.exists() and not self.out.is_dir():
            raise FailedPrecondition(f"{self.out}: exists and is not a directory")
        if self.out.is_dir() and any(self.out.iterdir()) and not force:
            raise FailedPrecondition(f"{self.out}: directory is not empty (use --force to replace it)")

    def __enter__(self) -> Path:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self._staging = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.building-", dir=self.out.parent))
        return self._staging

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        staging, self._staging = self._staging, None
        if staging is None:
            return
        if exc_type is not None:
            shutil.rmtree(staging)
            return  # the exception propagates
        self._publish(staging)

    def _publish(self, staging: Path) -> None:
        staging.chmod(0o755)  # mkdtemp makes it 0700
        if not self.out.exists():
            staging.rename(self.out)
            return
        old = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.old-", dir=self.out.parent))
        old.rmdir()
        self.out.rename(old)
        staging.rename(self.out)
        shutil.rmtree(old)
