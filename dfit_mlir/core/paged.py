"""Arrays kept in files of a scratch folder, mapped, their pages handed back between batches.

A long run holds a few arrays of a few bytes per invocation through the phases where it
peaks: the index walk's columns, the join's per-invocation totals and first submissions,
the chunk table, the trace plan's per-invocation accumulator (8 to 40 MiB each at 1M
invocations), so the peak grew with the run (issue 29). A full disk while they are
written or reserved is an ``OSError`` naming the file (never a SIGBUS at a mapped write). Mapped from a file (``MAP_SHARED``) and handed back
with ``madvise(MADV_DONTNEED)`` after each window or batch (:meth:`PagedArrays.release`),
only the pages one window touches are resident: the values stay in the file (in the
page cache until the kernel writes them), and a page touched again is read back from
there. Without a folder, the same calls give plain arrays in memory and ``release`` does
nothing: small runs and tests that have no scratch folder.
"""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

#: Values written at a time where an array is filled in place (2 MiB of int64).
PIECE_VALUES = 1 << 18


class PagedArrays:
    """Named arrays (1-D; an :meth:`appended` column may have rows of several values) in
    files of ``folder`` (a scratch folder dfit made, alive as long as the arrays are used),
    or in memory when ``folder`` is ``None``."""

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
        if not self.on_disk:
            values[...] = fill
        elif fill != 0:  # (a new file reads as zeros) filled a piece at a time, each handed back
            for begin in range(0, size, PIECE_VALUES):
                values[begin:begin + PIECE_VALUES] = fill
                self.release()
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

    def appended(self, name: str, dtype: Any, width: int = 1) -> Appended:
        """A new column ``name`` of ``width`` values a row, written a piece at a time
        (:class:`Appended`)."""
        return Appended(self, name, np.dtype(dtype), width)

    def copied(self, name: str, values: np.ndarray, step: int = 1 << 18) -> np.ndarray:
        """``values`` as array ``name``, copied ``step`` values at a time, each piece's
        pages handed back as it is written (in memory, or one of these arrays already:
        ``values`` itself). The caller drops ``values`` for the copy."""
        if not self.on_disk or self.holds(values):
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

    def holds(self, values: np.ndarray) -> bool:
        """Whether ``values`` is (a view of) one of these arrays in a file."""
        base: Any = values
        while isinstance(base, np.ndarray):
            base = base.base
        owner = base.obj if isinstance(base, memoryview) else base
        return any(owner is mapping for mapping in self._mappings.values())

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
        path = self._path(name)
        with path.open("r+b" if keep else "w+b") as file:
            file.truncate(size * dtype.itemsize)
            _reserve(path, file.fileno(), size * dtype.itemsize)
            mapping = mmap.mmap(file.fileno(), size * dtype.itemsize, access=mmap.ACCESS_WRITE)
        self._mappings[name] = mapping
        return np.frombuffer(mapping, dtype)


def _reserve(path: Path, fd: int, size: int) -> None:
    """Take the disk space of a file about to be mapped: a mapped write to a page the
    filesystem has no room for is a SIGBUS that kills the process, where a full disk
    here is the one-line error a full disk is anywhere else (exit 2, naming the file)."""
    if not hasattr(os, "posix_fallocate"):  # (macOS: the pages are found as they are written)
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _no_room(path, error) from None
        # (a filesystem that cannot reserve: written sparse, as without it)


def append_values(path: Path, values: np.ndarray) -> None:
    """Append ``values``' raw bytes to the file ``path``. A full disk is ``OSError``
    naming the file and saying so (numpy's ``tofile`` says "N requested and M written",
    with neither an errno nor a file name, which the CLI could only pin on its input).
    No values append nothing (an empty array of several columns has no bytes to view:
    a walked block without execute records would add one to the index's executions)."""
    if not values.size:
        return
    try:
        with path.open("ab") as file:
            file.write(np.ascontiguousarray(values).data.cast("B"))
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _no_room(path, error) from None
        raise OSError(error.errno, error.strerror or str(error), str(path)) from None


def _no_room(path: Path, error: OSError) -> OSError:
    return OSError(error.errno, f"{error.strerror} (dfit's scratch files of a long run: set TMPDIR to a folder "
                                f"with room)", str(path))


class Appended:
    """A column written a piece at a time (:meth:`add`) and read back once as one array
    (:meth:`array`): appended to its file as it comes, then mapped; in memory, the pieces
    joined and handed back (a walk's block-sized pieces sit in glibc's heap, under the
    mmap threshold, so freed they stayed resident under every column joined after them:
    70 MiB at 1M invocations, issue 29)."""

    def __init__(self, paged: PagedArrays, name: str, dtype: np.dtype[Any], width: int):
        self.paged, self.name, self.dtype, self.width = paged, name, dtype, width
        self.rows = 0
        self._pieces: list[np.ndarray] = []
        # Opened for each piece, not held open: a walk given up half-way (a profile the
        # windowed route leaves to the whole-run one) leaves no open file behind.
        self._path = paged._path(name) if paged.on_disk else None
        if self._path is not None:
            self._path.write_bytes(b"")

    def __len__(self) -> int:
        return self.rows

    def add(self, piece: np.ndarray) -> None:
        values = np.ascontiguousarray(piece, self.dtype)
        self.rows += len(values)
        if self._path is None:
            self._pieces.append(values)
        else:
            append_values(self._path, values)

    def groups(self, rows: int) -> Iterator[np.ndarray]:
        """Every row added, in order, in groups of about ``rows`` rows (a larger piece
        alone), never all at once; the column takes no more pieces (in memory, each
        group's pieces are let go as it is given)."""
        if self._path is not None:
            every = self.array()
            for begin in range(0, len(every), rows):
                yield every[begin:begin + rows]
                self.paged.release()
            return
        pieces = self._pieces
        while pieces:
            taken, count = 0, 0
            while taken < len(pieces) and (not taken or count + len(pieces[taken]) <= rows):
                count += len(pieces[taken])
                taken += 1
            group = np.concatenate(pieces[:taken])
            del pieces[:taken]
            yield group

    def so_far(self) -> np.ndarray:
        """Every row added so far, in order, the column still taking pieces (what a
        reader of a column still growing sees: its pieces joined into one, in memory)."""
        shape = (self.rows,) if self.width == 1 else (self.rows, self.width)
        if self._path is None:
            if len(self._pieces) > 1:
                self._pieces[:] = [np.concatenate(self._pieces)]
            return self._pieces[0].reshape(shape) if self._pieces else np.zeros(shape, self.dtype)
        return self.paged._mapped(self.name, self.rows * self.width, self.dtype, keep=self.rows).reshape(shape)

    def array(self) -> np.ndarray:
        """Every row added, in order (``(rows,)``, or ``(rows, width)``); the column takes
        no more pieces."""
        shape = (self.rows,) if self.width == 1 else (self.rows, self.width)
        if self._path is None:
            from dfit_mlir.core.perf import release_freed_memory

            pieces, self._pieces = self._pieces, []
            joined = np.concatenate(pieces).reshape(shape) if pieces else np.zeros(shape, self.dtype)
            if len(pieces) > 1:
                del pieces
                release_freed_memory(now=True)
            return joined
        return self.so_far()
