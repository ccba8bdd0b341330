"""Arrays kept in files of a scratch folder, mapped, their pages handed back between batches.

A long run holds a few arrays of a few bytes per invocation through the phases where it
peaks: the join's per-invocation totals and first submissions, the index's chunk table,
the trace plan's per-invocation accumulator (8 to 40 MiB each at 1M invocations), so the
peak grew with the run (issue 29). Mapped from a file (``MAP_SHARED``) and handed back
with ``madvise(MADV_DONTNEED)`` after each window or batch (:meth:`PagedArrays.release`),
only the pages one window touches are resident: the values stay in the file (in the
page cache until the kernel writes them), and a page touched again is read back from
there. Without a folder, the same calls give plain arrays in memory and ``release`` does
nothing: small runs and tests that have no scratch folder.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np


class PagedArrays:
    """Named 1-D arrays in files of ``folder`` (a scratch folder dfit made, alive as long
    as the arrays are used), or in memory when ``folder`` is ``None``."""

    def __init__(self, folder: Path | None):
        # (a platform without madvise keeps them in memory, as without a folder)
        self.folder = folder if hasattr(mmap, "MADV_DONTNEED") else None
        self._mappings: dict[str, mmap.mmap] = {}

    @property
    def on_disk(self) -> bool:
        return self.folder is not None

    def full(self, name: str, size: int, fill: Any, dtype: Any) -> np.ndarray:
        """A new array ``name`` of ``size`` values ``fill``."""
        values = self._mapped(name, size, np.dtype(dtype))
        if fill != 0 or not self.on_disk or not size:  # a new file reads as zeros
            values[...] = fill
        return values

    def grown(self, name: str, values: np.ndarray, size: int, fill: Any) -> np.ndarray:
        """Array ``name`` (now ``values``) made ``size`` long, its new values ``fill``:
        the file is extended and mapped again (in memory: resized in place, a realloc).
        ``values`` must not be used after."""
        held = len(values)
        if not self.on_disk:
            values.resize(size, refcheck=False)
            grown = values
        else:
            dtype = values.dtype
            del values  # its mapping closes once nothing views it
            grown = self._mapped(name, size, dtype, keep=held)
        grown[held:] = fill
        return grown

    def copied(self, name: str, values: np.ndarray, step: int = 1 << 18) -> np.ndarray:
        """``values`` as array ``name``, copied ``step`` values at a time, each piece's
        pages handed back as it is written (in memory: ``values`` itself). The caller
        drops ``values`` for the copy."""
        if not self.on_disk:
            return values
        copy = self._mapped(name, len(values), values.dtype)
        for begin in range(0, len(values), step):
            copy[begin:begin + step] = values[begin:begin + step]
            self.release()
        return copy

    def pieces(self, *arrays: np.ndarray, step: int = 1 << 18) -> Iterator[tuple[np.ndarray, ...]]:
        """``arrays`` (of one length) ``step`` values at a time, side by side: views,
        each piece's pages handed back once the next is asked for."""
        for begin in range(0, len(arrays[0]) if arrays else 0, step):
            yield tuple(values[begin:begin + step] for values in arrays)
            self.release()

    def release(self) -> None:
        """Hand back every mapped page (their values stay in the files)."""
        for mapping in self._mappings.values():
            mapping.madvise(mmap.MADV_DONTNEED)

    def discard(self) -> None:
        """Remove the files (each mapping closes once nothing views it): for arrays that
        are done with before their folder is."""
        for name in self._mappings:
            self._path(name).unlink(missing_ok=True)
        self._mappings.clear()

    def _path(self, name: str) -> Path:
        assert self.folder is not None
        return self.folder / f"{name}.values"

    def _mapped(self, name: str, size: int, dtype: np.dtype[Any], keep: int = 0) -> np.ndarray:
        if self.folder is None or size == 0:
            return np.empty(size, dtype)
        with self._path(name).open("r+b" if keep else "w+b") as file:
            file.truncate(size * dtype.itemsize)
            mapping = mmap.mmap(file.fileno(), size * dtype.itemsize, access=mmap.ACCESS_WRITE)
        self._mappings[name] = mapping
        return np.frombuffer(mapping, dtype)
