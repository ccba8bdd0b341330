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
