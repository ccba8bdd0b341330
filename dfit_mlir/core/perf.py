"""Small performance helpers."""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while building large acyclic tables.

    Walking a 100k-op module creates millions of short-lived objects, and CPython 3.11
    runs full collections over all of them as the tables grow: 20-30% of tagging time
    (benchmarks/tag_scale.py). Nothing built inside forms reference cycles. Re-entrant:
    only the outermost use turns the collector back on.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def release_freed_memory() -> None:
    """Hand what was freed back to the system: Arrow's pool (its allocator keeps what a
    batch's temporaries freed, and the next batch's do not always fit in it) and glibc's
    heap (numpy's temporaries). Called between a long run's batches and phases, so each
    starts from the live memory, not from the last one's high-water mark: without it a
    run's peak grew with its length (issue 29)."""
    import ctypes
    import sys

    if "pyarrow" in sys.modules:  # nothing of Arrow's to hand back otherwise
        sys.modules["pyarrow"].default_memory_pool().release_unused()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: its allocator keeps what it keeps
        pass
