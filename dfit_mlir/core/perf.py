"""Small performance helpers."""

from __future__ import annotations

import contextlib
import gc
from typing import Any, Iterator


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


#: Resident memory a process may gain over what it held after its last hand-back before
#: :func:`release_freed_memory` hands back again. Handing back after every batch made the
#: next batch fault its pages in afresh (``dfit view`` of a 5M-event bundle: 16.6 s with
#: no hand-back at 305 MiB, 23.2 s with one per batch at 218 MiB); with this slack, only
#: when freed memory piles up.
RELEASE_SLACK_BYTES = 32 << 20
_held_after_release = [0]


def release_freed_memory(*, now: bool = False) -> None:
    """Hand what was freed back to the system: Arrow's pool (its allocator keeps what a
    batch's temporaries freed, and the next batch's do not always fit in it) and glibc's
    heap (numpy's temporaries). Called between a long run's batches, it acts once the
    process holds :data:`RELEASE_SLACK_BYTES` more than after the last hand-back (or at
    once with ``now``, between phases), so each batch starts from about the live memory,
    not from the last one's high-water mark: without it a run's peak grew with its length
    (issue 29)."""
    import ctypes
    import sys

    if not now and _resident_bytes() < _held_after_release[0] + RELEASE_SLACK_BYTES:
        return
    if "pyarrow" in sys.modules:  # nothing of Arrow's to hand back otherwise
        sys.modules["pyarrow"].default_memory_pool().release_unused()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: its allocator keeps what it keeps
        pass
    _held_after_release[0] = _resident_bytes()


#: glibc's ``M_MMAP_THRESHOLD`` (``mallopt``'s parameter number) and the value dfit sets:
#: blocks of this size or more are mapped on their own and unmapped when freed.
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 1 << 20


def fix_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD_BYTES` for this process (whether
    it was set: not glibc, nothing done). By default the threshold follows the largest
    mapped block freed so far (up to 32 MiB), so once a batch's multi-MiB buffers are
    freed, the next ones come from the heap, which fragments and keeps them: a 5M-event
    ``dfit run`` peaked at 292-324 MiB over runs of the same profile, 255-260 MiB with
    the threshold fixed at 16 MiB; a 660k-event one 266-277 and 244-250 MiB, its post-run
    work 0.1-0.2 s (5-10 %) slower (benchmarks/RESULTS.md, "Long runs", sixth step). At
    1 MiB since each event family is written in whole batches (thirteenth step): the
    batches' column buffers (0.5-9 MiB each, from several threads' heaps at once) are
    then mapped and unmapped on their own instead of raising each heap's high-water
    mark — a 990k-event run 301-303 MiB at 16 MiB, 282-288 at 1 MiB, in about the same
    time; a 5M-event one 274 and 262 MiB; ``dfit analyze`` and ``dfit view`` of a
    5M-event bundle the same time and memory. Set by ``mallopt``, not the environment,
    so that the IREE tools dfit runs keep their own allocator settings."""
    import ctypes

    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False


def _resident_bytes() -> int:
    """This process's resident set (``/proc/self/statm``; 0 where there is none)."""
    import os

    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def sorted_distinct(values: Any) -> Any:
    """``np.unique(values)`` of a 1-D integer array, by sorting a copy. numpy 2's
    ``np.unique`` collects the distinct values in a hash table first, outside numpy's
    own (and ``tracemalloc``'s) accounting, at about 60 bytes a distinct value: 1.5M
    distinct int64 peaked 90 MiB above where they started, sorted 25 MiB (a
    1M-invocation run has 1M distinct executions; issue 29)."""
    import numpy as np

    ordered = np.sort(values)
    return ordered[:_distinct_to_front(ordered)].copy()


def distinct_in_place(values: Any, step: int = 1 << 18) -> int:
    """Sort the 1-D array ``values`` in place and move its distinct values to its front,
    in order, ``step`` values at a time (each piece's distinct ones are copied before
    anything at or after them is written); returns how many there are. No second array
    as large: 8 bytes a value less than :func:`sorted_distinct` (1M executions of a
    long run, issue 29)."""
    values.sort()
    return _distinct_to_front(values, step)


def _distinct_to_front(values: Any, step: int = 1 << 18) -> int:
    """Move the distinct values of the sorted 1-D array ``values`` to its front, in
    order, a piece at a time; how many there are."""
    import numpy as np

    count, last = 0, None
    for begin in range(0, len(values), step):
        piece = values[begin:begin + step]
        keep = np.empty(len(piece), bool)
        keep[0] = last is None or piece[0] != last
        np.not_equal(piece[1:], piece[:-1], out=keep[1:])
        last = piece[-1].copy()
        found = piece[keep]  # a copy: taken before the writes below reach this piece
        values[count:count + len(found)] = found
        count += len(found)
    return count


def exact_median(values: Any) -> int | float:
    """``statistics.median`` of a non-empty 1-D integer array, taken on the array (no
    list of Python ints): the middle value, or the mean of the two middle ones divided
    as Python divides ints (exact, where a float64 sum would round large values)."""
    import numpy as np

    middle = len(values) // 2
    partitioned = np.partition(values, [middle] if len(values) % 2 else [middle - 1, middle])
    return middle_value(len(values), lambda k: int(partitioned[k]))


def middle_value(count: int, kth: Any) -> int | float:
    """``statistics.median``'s rule for ``count`` values, given ``kth(k)``, the ``k``-th
    smallest (from 0): the middle one, or the mean of the two middle ones (ints divided
    as Python divides them, exact where a float64 sum would round large values)."""
    middle = count // 2
    return kth(middle) if count % 2 else (kth(middle - 1) + kth(middle)) / 2


def add_counts(counts: Any, index: Any) -> None:
    """``counts[i] += 1`` for each ``i`` of ``index`` (non-negative integers, repeats
    counted), by a ``bincount`` over the span ``index`` covers: a batch or a window holds
    a few invocations, and a ``bincount`` of the counts' whole length was a temporary
    that size per call (8 MiB at 1M invocations, a few hundred calls; issue 29)."""
    import numpy as np

    if len(index):
        low = int(index.min())
        found = np.bincount(index - low)
        counts[low:low + len(found)] += found


def kth_smallest(pieces: Any, k: int) -> int:
    """The ``k``-th smallest (from 0) of the int64 values ``pieces()`` yields (a fresh
    iterator of arrays on each call), found 16 bits at a time from the top (a radix
    select: four passes over the values, each a 65,536-bin count of the values that
    share the bits found so far), so that no more than one piece is in memory: the
    median of a long run's per-invocation times, which live in a file (issue 29)."""
    import numpy as np

    bias = np.uint64(1 << 63)  # int64 order as unsigned order: flip the sign bit
    prefix, left = 0, k
    for shift in (48, 32, 16, 0):
        counts = np.zeros(1 << 16, np.int64)
        for piece in pieces():
            keys = np.asarray(piece, np.int64).view(np.uint64) ^ bias
            if shift < 48:
                keys = keys[(keys >> np.uint64(shift + 16)) == np.uint64(prefix)]
            counts += np.bincount(((keys >> np.uint64(shift)) & np.uint64(0xFFFF)).astype(np.intp), minlength=1 << 16)
        before = np.cumsum(counts)
        digit = int(np.searchsorted(before, left, side="right"))
        if digit == len(before):
            raise IndexError(f"the values hold fewer than {k + 1}")
        left -= int(before[digit - 1]) if digit else 0
        prefix = (prefix << 16) | digit
    return int(np.array([prefix ^ (1 << 63)], np.uint64).view(np.int64)[0])
