"""What a Calculet process sets before its imports: one OpenBLAS thread, and no collector passes.

Both cut CPU that every process start paid for nothing (docs/performance.md, "The test suite's
time"). The entry modules call them above their own imports (`calculet-daemon`, `calculet-gateway`,
`calctl`), so this module imports nothing but the standard library.

- `one_blas_thread`: numpy loads OpenBLAS, which starts a thread per core that spins for a while.
  No Calculet process makes a BLAS call: the calsim kernels and the sampler are elementwise numpy.
  An environment that sets `OPENBLAS_NUM_THREADS` keeps its value.
- `pause_collector` / `resume_collector`: the imports build tens of thousands of objects that live as
  long as the process, and the collector's passes over them free nothing. It pauses for the imports,
  and what they built is frozen (`gc.freeze`) before it resumes. A pause alone only moves the cost:
  the first passes after it would walk every one of those objects.
"""

from __future__ import annotations

import gc
import os


def one_blas_thread() -> None:
    """OpenBLAS on one thread for this process and its children, unless the environment chose."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def pause_collector() -> bool:
    """Stop the collector for the imports that follow.

    Returns:
        Whether this call paused it: False when it was already off (an importer such as a test
        collection paused it, and resumes it itself).
    """
    collecting = gc.isenabled()
    gc.disable()
    return collecting


def resume_collector(paused: bool) -> None:
    """After the imports: freeze what they built, then resume the collector if `pause_collector`
    paused it (`paused`, its return value); else leave both to whoever paused it."""
    if paused:
        gc.freeze()
        gc.enable()
