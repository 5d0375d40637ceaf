"""A command's heavy imports, frozen out of the cyclic garbage collector.

Importing torch, torch.distributed.checkpoint and MLflow with its SQL store makes some 300,000
long-lived objects. CPython's collector scans all of them in every full collection: several while
they load and more while a run trains. A ``diffsweep train`` of 12 tiny steps spent 8.1 CPU-s
with them scanned and 5.1 with them frozen (``gc.freeze``: moved out of the collector's reach;
mean of 5 runs on the 2-core CI machine, ``analysis/benchmarks/RESULTS.md``, "The test suite").

Only a process that is a diffsweep command or job freezes (its entry point says so with
``command_process()``), and only at start-up, before any model or run exists: a frozen object
is never collected as part of a reference cycle, which is right for modules and wrong for a test
process or a library user's objects. Elsewhere ``imports_frozen()`` just runs its block.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_COMMAND = False


def command_process() -> None:
    """Mark this process as a diffsweep command or job (called by its entry point)."""
    global _COMMAND
    _COMMAND = True


@contextmanager
def imports_frozen() -> Iterator[None]:
    """In a command process: the block's imports with the collector off, then everything alive
    frozen (``gc.freeze``) and the collector back on. Elsewhere: just the block."""
    if not _COMMAND:
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
