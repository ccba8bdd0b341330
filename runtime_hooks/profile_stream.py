"""A raw HAL profile (``.ireeprof``) read in windows of whole flushes, so that a long
run's decode and join hold one window of records at a time, not the run (issue 29).

``iree-benchmark-module`` flushes the profile after every invocation: one chunk per
event family and flush, the queue-events chunk first (``profile_flushes``). A *window*
is a run of whole flushes holding about :data:`WINDOW_RECORDS` event records, cut just
before a queue-events chunk; it is read with one ``pread`` of its byte range (never the
whole file, never a growing ``mmap`` footprint) and its records gathered into the
reader's structured arrays (:data:`profile_file.FAMILY_DTYPES`).

:class:`ProfileIndex` is the one pass over the whole file that a window's work needs
first: every event chunk (family, payload offset, record count), the window cuts, and
the run's small facts — command-buffer executions, the first submission of each flush,
the distinct operation types of each family, the export names, dropped records. Given
a :class:`~dfit_mlir.core.paged.PagedArrays` (``dfit run`` gives its scratch folder),
the walk writes its per-chunk and per-execution columns to files as it goes and the
index reads them back a piece at a time, the pages handed back as read: the index of a
1M-invocation run peaks where a 227k-invocation one does (121 against 117 MiB).

The join needs every record of a submission together (a command buffer's block), but
the records of work a call did not wait for may be written by a later flush. So window
``w`` *owns* the submissions from its first queue event up to the next window's, and its
dispatch records are taken from windows ``w - 1``, ``w`` and ``w + 1`` (one window of
look-ahead, which is thousands of flushes); the index checks that every dispatch record
lies within one window of its owner. A GPU driver's records (``dispatch-events``,
``queue-device-events``) are timed in device ticks, placed on the host's clock with the
whole profile's clock fit: the index keeps each device's first and last
clock-correlation sample as it walks (:class:`_ClockEnds`), so every window is placed
with the fit the whole-run route uses. Anything the windowed route does not take on —
records further away, queue events of several streams, dropped records, an operation it
does not know, a block the columnar join leaves to the per-record join — is
:class:`WindowedRouteUnavailable`, whose reason is shown in the run summary, and the run
takes the whole-run route, which decides or names the error.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from dfit_mlir.core.paged import PagedArrays
from dfit_mlir.core.perf import distinct_in_place, release_freed_memory, sorted_distinct
from dfit_mlir.runtime_hooks import profile_file as pf
from dfit_mlir.runtime_hooks.join_records import NO_COMMAND_INDEX, DispatchColumns, Executions

#: Event records per window (all families): about 6 MiB of profile, a few MiB of columns.
WINDOW_RECORDS = 65_536
QUEUE, HOST = pf.FAMILY_CODES["queue-events"], pf.FAMILY_CODES["host-execution-events"]
#: Families whose records carry device ticks: placed with the whole profile's clock fit
#: (:class:`_ClockEnds`).
DEVICE_TICK_FAMILIES = frozenset({"dispatch-events", "queue-device-events"})
_NO_SUBMISSION = np.iinfo(np.int64).max
_BEFORE_ALL = np.iinfo(np.int64).min


class WindowedRouteUnavailable(Exception):
    """This profile is not one the windowed route takes on; the message says why."""


@dataclass(frozen=True)
class ProfileIndex:
    """Where everything in one ``.ireeprof`` is, and the run's small facts (see the module doc)."""

    path: Path
    version: tuple[int, int]
    #: One row per event chunk, in file order.
    chunk_family: np.ndarray
    chunk_payload_at: ChunkOffsets
    chunk_records: np.ndarray
    #: Chunk row where each window begins, and one past the last (``len(windows) + 1`` rows).
    window_chunks: np.ndarray
    #: First submission each window owns (the first window: every submission before).
    window_submissions: np.ndarray
    #: (executable_id, function_ordinal) -> export name.
    functions: dict[tuple[int, int], str]
    #: (submission, command buffer) of every ``execute`` record (queue and host-execution), distinct.
    executions: Executions
    #: First submission of each flush that holds queue events (``hal_profile._chunk_starts``).
    flush_starts: np.ndarray
    #: family -> distinct ``type`` values of its records (the event names a run writes).
    types: dict[str, np.ndarray]
    #: family -> number of records.
    counts: dict[str, int]
    #: Whether the driver numbers commands (some dispatch record has a command index).
    numbered: bool
    #: Host-execution records that are dispatches.
    dispatch_records: int
    #: Windows whose submissions hold a command buffer's first dispatch records (the
    #: windows the join must see to know every buffer's recording).
    first_buffer_windows: tuple[int, ...] = ()
    read_stats: dict[str, int] = field(default_factory=dict)
    #: Each event chunk's physical device ordinal (a GPU driver's dispatch records take
    #: their device from their chunk).
    chunk_device: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    #: The family holding the dispatch records: the CPU drivers' host-execution records,
    #: or a GPU driver's ``dispatch-events`` (device ticks, placed with :attr:`clocks`).
    dispatch_family: str = "host-execution-events"
    #: Per device, the whole profile's clock fit (``None``: no device-tick family).
    clocks: dict[int, Any] | None = None

    @property
    def windows(self) -> int:
        return len(self.window_chunks) - 1

    def for_join(self, paged: PagedArrays | None = None) -> ProfileIndex:
        """This index without the facts that place the invocations (:attr:`executions`,
        :attr:`flush_starts`: read once, before the join), which the join does not read:
        23 MiB at 1M invocations; its chunk table (9 bytes a chunk, 27 MiB at 1M
        invocations) in ``paged``'s files, read a window's rows at a time."""
        placed = replace(self, executions=Executions(np.zeros(0, np.int64), np.zeros(0, np.int64)),
                         flush_starts=np.zeros(0, np.int64))
        if paged is None or not paged.on_disk:
            return placed
        offsets, device = self.chunk_payload_at, self.chunk_device
        return replace(placed, chunk_family=paged.copied("chunk_family", self.chunk_family),
                       chunk_records=paged.copied("chunk_records", self.chunk_records),
                       chunk_payload_at=replace(offsets, within=paged.copied("chunk_within", offsets.within)),
                       # (one device for the whole file is one value already: _device_column)
                       chunk_device=device if device.strides == (0,) else paged.copied("chunk_device", device))

    def owned(self, window: int) -> tuple[int, int]:
        """[first, end) of the submissions window ``window`` owns."""
        first = int(self.window_submissions[window]) if window else _BEFORE_ALL
        end = int(self.window_submissions[window + 1]) if window + 1 < self.windows else _NO_SUBMISSION
        return first, end

    def family_devices(self, family: str, window: int) -> np.ndarray:
        """The physical device ordinal of each record :meth:`family_window` gives (its chunk's)."""
        rows = slice(int(self.window_chunks[window]), int(self.window_chunks[window + 1]))
        mine = self.chunk_family[rows] == pf.FAMILY_CODES[family]
        return np.repeat(self.chunk_device[rows][mine], self.chunk_records[rows][mine])

    def family_window(self, family: str, window: int) -> np.ndarray:
        """The records of ``family`` in window ``window``'s chunks, in file order."""
        return self.window_records(window, (family,))[family]

    def window_records(self, window: int, families: Sequence[str]) -> dict[str, np.ndarray]:
        """family -> its records in window ``window``'s chunks, in file order, for each of
        ``families``: the window's bytes mapped once for all of them."""
        rows = slice(int(self.window_chunks[window]), int(self.window_chunks[window + 1]))
        chunk_family, payload_at, records = self.chunk_family[rows], self.chunk_payload_at[rows], self.chunk_records[rows]
        mine = {family: chunk_family == pf.FAMILY_CODES[family] for family in families}
        found = {family: np.zeros(0, pf.FAMILY_DTYPES[family]) for family in families if not mine[family].any()}
        wanted = [family for family in families if family not in found]
        if not wanted:
            return found
        low = min(int(payload_at[mine[family]][0]) for family in wanted)
        high = max(int(payload_at[mine[family]][-1]) + int(records[mine[family]][-1]) * pf.FAMILY_DTYPES[family].itemsize
                   for family in wanted)
        # Mapped, not read: a window's families interleave, so one family's records are a
        # part of its bytes, and the gather copies only those (reading the range instead
        # copied it whole once per family: 0.22 s against 0.12 s for a 1M-record profile).
        # One mapping for every family asked: mapping the window once per family
        # faulted its pages in once per family (all four: 0.083 s against 0.061 s).
        start = low - low % mmap.ALLOCATIONGRANULARITY
        with open(self.path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size < high:
                raise pf.ProfileFormatError(f"{self.path}: the file ends at byte {size}, before byte {high}, where "
                                            f"a {'/'.join(wanted)} chunk ended when it was indexed")
            # gather's views of the mapping end with its call (items_at's), so the mapping
            # closes even when gather raises: nothing in the traceback exports its buffer.
            with mmap.mmap(handle.fileno(), high - start, access=mmap.ACCESS_READ, offset=start) as mapping:
                for family in wanted:
                    found[family] = pf.gather(self.path, mapping, start, payload_at[mine[family]],
                                              records[mine[family]], family)
        return {family: found[family] for family in families}


class WindowReads:
    """Each window's records, read a group of families at a time (one mapping of the
    window's bytes each, :meth:`ProfileIndex.window_records`) the first time one of the
    group is asked for, and held until :meth:`forget_before`. The join reads a window's
    dispatch records a window ahead (the look-ahead of the module doc) and its rows are
    placed after: ``groups`` is then the dispatch family, then the rows' other families,
    so that the rows of the next window are not read (and held) before they are placed,
    and the host-execution family, both dispatches and rows, is read once. (A 1M-record
    profile's windows, every family: 0.083 s one family at a time, 0.061 s all at once.)"""

    def __init__(self, index: ProfileIndex, groups: Sequence[Sequence[str]]):
        self.index = index
        self.groups = tuple(tuple(group) for group in groups if group)
        self._group_of = {family: group for group in self.groups for family in group}
        self._held: dict[int, dict[str, np.ndarray]] = {}

    def __call__(self, window: int, family: str) -> np.ndarray:
        """The records of ``family`` (of one of :attr:`groups`) in window ``window``."""
        held = self._held.setdefault(window, {})
        if family not in held:
            held.update(self.index.window_records(window, self._group_of[family]))
        return held[family]

    def forget_before(self, window: int) -> None:
        """Let go of the windows before ``window``."""
        for old in [held for held in self._held if held < window]:
            del self._held[old]


@dataclass(frozen=True)
class ChunkOffsets:
    """Each event chunk's payload offset, 4 bytes a chunk where the offsets themselves
    are 8 (12 MiB less at 1M invocations, 3 chunks each, through the whole join): per
    walked block, its first chunk's row and offset, and each chunk's offset from it
    (within a block, under 4 GiB: a block is 8 MiB of records, or one larger record).
    Indexed as the int64 column it stands for (``offsets[rows]``, ``np.asarray(offsets)``)."""

    block_rows: np.ndarray  # int64, the first chunk row of each block, increasing
    block_base: np.ndarray  # int64, that chunk's payload offset
    within: np.ndarray  # uint32, each chunk's offset from its block's base

    def __len__(self) -> int:
        return len(self.within)

    def __getitem__(self, rows: Any) -> np.ndarray:
        positions = np.arange(*rows.indices(len(self))) if isinstance(rows, slice) else np.asarray(rows)
        block = np.searchsorted(self.block_rows, positions, side="right") - 1
        return self.block_base[block] + self.within[rows]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self[slice(None)]
        return whole if dtype is None else whole.astype(dtype)


class _OffsetParts:
    """The walk's :class:`ChunkOffsets`, a block at a time."""

    def __init__(self, paged: PagedArrays | None = None) -> None:
        self.rows: list[int] = []
        self.base: list[int] = []
        self.within = (PagedArrays(None) if paged is None else paged).appended("chunk_within", np.uint32)

    def add(self, first_row: int, payload_at: np.ndarray) -> None:
        base = int(payload_at[0])
        within = payload_at - base  # increasing: the last is the largest
        if int(within[-1]) > np.iinfo(np.uint32).max:  # not from one block: a bug of the walk's, not a file's
            raise AssertionError(f"a block's chunks span {int(within[-1])} bytes")
        self.rows.append(first_row)
        self.base.append(base)
        self.within.add(within)

    def joined(self) -> ChunkOffsets:
        return ChunkOffsets(np.array(self.rows, np.int64), np.array(self.base, np.int64), self.within.array())

    def so_far(self) -> ChunkOffsets:
        """:meth:`joined` of the blocks walked so far, the walk going on."""
        return ChunkOffsets(np.array(self.rows, np.int64), np.array(self.base, np.int64), self.within.so_far())


class _ClockEnds:
    """Per physical device, the first and last clock-correlation sample
    (:func:`profile_file.clock_samples`' tuples, in their order), their number and the
    widest host bracket: what IREE's fit (``hal_profile._fits``) reads of a whole
    profile's samples, kept while the index walks it (there is a sample a flush, so the
    samples themselves grow with the run)."""

    def __init__(self, path: Path):
        self.path = path
        #: device -> [first sample, last sample, samples, widest bracket]
        self.ends: dict[int, list[Any]] = {}

    def add(self, found: np.ndarray, version: tuple[int, int]) -> None:
        tables = pf.ProfileTables(self.path, version, records={"clock-correlations": found})
        for device, samples in pf.clock_samples(tables).items():
            first, last, widest = min(samples), max(samples), max(sample[2] for sample in samples)
            known = self.ends.get(device)
            if known is None:
                self.ends[device] = [first, last, len(samples), widest]
            else:
                known[:] = [min(known[0], first), max(known[1], last), known[2] + len(samples),
                            max(known[3], widest)]

    def fits(self) -> dict[int, Any]:
        """``hal_profile._fits`` of the samples seen: per device with two distinct ticks."""
        from dfit_mlir.runtime_hooks.hal_profile import ClockFit

        return {device: ClockFit(device, first[0], first[1], last[0], last[1], count, widest)
                for device, (first, last, count, widest) in self.ends.items()
                if count >= 2 and last[0] > first[0]}


class _Walk:
    """The index's one pass: the record headers, block by block (:data:`profile_file.BLOCK_BYTES`).
    What it finds per chunk, per execution and per flush is written to ``paged``'s
    columns as each block is walked (in files, where it has a folder: about 90 bytes an
    invocation that the index phase otherwise held, issue 29)."""

    def __init__(self, path: Path, paged: PagedArrays | None = None):
        self.path = path
        self.paged = PagedArrays(None) if paged is None else paged
        self.family = self.paged.appended("chunk_family", np.int8)
        self.payload_at = _OffsetParts(self.paged)
        self.records = self.paged.appended("chunk_records", np.int32)
        self.device: list[np.ndarray] = []  # each event chunk's physical device ordinal
        self.clocks = _ClockEnds(path)
        self.dispatch_families: set[str] = set()
        self.functions: dict[tuple[int, int], str] = {}
        self.dropped: dict[str, int] = {}
        self.queue_streams: set[int] = set()
        self.device_ticks: set[str] = set()
        #: (submission, command buffer) of the execute records, distinct within each block.
        self.executions = self.paged.appended("walk_executions", np.int64, width=2)
        self.flush_starts = self.paged.appended("flush_starts", np.int64)  # the first submission of each queue chunk
        #: The last submission of the last queue chunk walked, the queue chunks walked, and
        #: the first whose submissions do not all come after the one before's (``None``: none).
        self.queue_last = _BEFORE_ALL
        self.queue_chunks = 0
        self.late_flush: int | None = None
        #: (chunk row, first, last submission) per chunk with dispatch records.
        self.dispatch_bounds = self.paged.appended("walk_dispatch_bounds", np.int64, width=3)
        self.types: dict[str, set[int]] = {}
        self.numbered = False
        self.dispatch_records = 0
        #: command buffer -> chunk row of its first dispatch record.
        self.buffers: dict[int, int] = {}
        self.chunks = 0
        self.blocks = 0
        self.version = (0, 0)
        #: Where the walk goes on (``None``: the file's header is not read yet).
        self.offset: int | None = None
        #: Whether an index was made of it (its lists are then emptied: walked once, used once).
        self.indexed = False
        self._reader = pf.BlockReader()

    def run(self) -> None:
        """Walk the finished file to its end, from where :meth:`follow` left it."""
        with open(self.path, "rb") as handle:
            fd = handle.fileno()
            if self.offset is None:
                self._start(fd)
            size = os.fstat(fd).st_size
            (logical_end,) = struct.unpack("<Q", os.pread(fd, 8, 16))
            end = pf.file_end(self.path, logical_end, size)
            pf.first_record(self.path, self.offset, end)
            # The file is finished: each next block is read while this one is walked.
            with pf.BlockReader(ahead=True) as reader:
                self._walk_to(fd, end, reader, following=False)

    def follow(self, finished: threading.Event, flushed: Callable[[int], None] | None = None,
               walked: Callable[[_Walk, threading.Event], None] | None = None) -> None:
        """Walk the profile while its writer writes it, up to its last whole record every
        :data:`FOLLOW_BYTES` it grows, until ``finished`` is set; :meth:`run` then walks
        the rest. The writer appends whole records one after the other and fills in the
        header's length only when it closes the file (the length is 0 meanwhile), so a
        record the walk takes is never written again. ``flushed``: told the flushes (queue
        chunks: invocations) walked so far after each step; ``walked``: handed the walk
        and ``finished`` after each step, in this thread (what it reads of the walk cannot
        change meanwhile: :func:`index_so_far`)."""
        fd: int | None = None
        try:
            while not finished.wait(FOLLOW_POLL_SECONDS):
                try:
                    size = os.stat(self.path).st_size
                except FileNotFoundError:  # not created yet
                    continue
                if fd is None:
                    if size < FILE_HEADER_BYTES:
                        continue
                    fd = os.open(self.path, os.O_RDONLY)
                    self._start(fd)
                assert self.offset is not None
                if size - self.offset >= FOLLOW_BYTES:
                    self._walk_to(fd, size, self._reader, following=True)
                    if flushed is not None:
                        flushed(self.queue_chunks)
                    if walked is not None:
                        walked(self, finished)
        finally:
            self._reader.close()  # its buffers: the rest is walked by run, reading ahead
            if fd is not None:
                os.close(fd)

    def _start(self, fd: int) -> None:
        reader = pf.ProfileFileReader(self.path)
        version = self.version = reader.version()
        if version not in pf.KNOWN_VERSIONS:
            raise WindowedRouteUnavailable(f"HAL profile format {version[0]}.{version[1]}")
        self.offset = pf.first_record(self.path, struct.unpack("<4sHHI", os.pread(fd, 12, 0))[3])

    def _walk_to(self, fd: int, end: int, reader: pf.BlockReader, *, following: bool) -> None:
        """Index the records from :attr:`offset` to ``end``, a block at a time. Following
        a file still written, ``end`` is its size so far: the walk stops at the first
        record not yet whole, to go on from there."""
        assert self.offset is not None
        for block, base, found in pf.walked_blocks(self.path, fd, self.offset, end, reader, following=following):
            self._take(block, base, found)
            self.blocks += 1
            self.offset = base + found.walked
            release_freed_memory()  # what the block's temporaries freed, as it piles up

    def _take(self, block: np.ndarray, base: int, found: pf.BlockRecords) -> None:
        """Index the walked records ``found`` of ``block`` (the file from byte ``base``)."""
        codes, heads = found.codes, found.heads
        pf.block_metadata(self.path, block, base, found, self.functions, self.dropped)
        event = np.flatnonzero((codes >= 0) & (codes < len(pf.FAMILIES)) & (heads["payload_length"] > 0))
        self.queue_streams.update(np.unique(heads["stream_id"][event[codes[event] == QUEUE]]).tolist())
        family = codes[event].astype(np.int8)
        records = heads["payload_length"][event].astype(np.int64) // pf.ITEM_SIZES[family]
        if len(family):
            self._decode(block, base, family, found.payload_at(base, event), records,
                         heads["device"][event].astype(np.int32))

    def _decode(self, block: bytes | np.ndarray | mmap.mmap, base: int, family: np.ndarray, payload_at: np.ndarray,
                records: np.ndarray, devices: np.ndarray) -> None:
        """The small facts of this block's chunks (see :class:`ProfileIndex`)."""
        first_row = self.chunks
        self.chunks += len(family)
        self.family.add(family)
        self.payload_at.add(first_row, payload_at)
        self.records.add(records)
        if len(devices) and (devices == devices[0]).all():
            # One device (every CPU run, a one-GPU run): held as one value (a zero-stride
            # view), not 4 bytes a chunk (12 MiB at 1M invocations, and as much joined).
            devices = np.broadcast_to(devices[:1].copy(), devices.shape)
        self.device.append(devices)
        executions: list[np.ndarray] = []
        for code in np.unique(family).tolist():
            name = pf.FAMILIES[code]
            mine = family == code
            if name in DEVICE_TICK_FAMILIES:
                self.device_ticks.add(name)
            if name in ("memory-events", "queue-device-events"):  # only their types matter here
                types = pf.gather_field(block, base, payload_at[mine], records[mine], name, "type")
                self.types.setdefault(name, set()).update(_distinct(types))
                continue
            if name == "clock-correlations":
                self.clocks.add(pf.gather(self.path, block, base, payload_at[mine], records[mine], name), self.version)
                continue
            if name not in ("queue-events", "host-execution-events", "dispatch-events"):
                continue
            found = pf.gather(self.path, block, base, payload_at[mine], records[mine], name)
            counts = records[mine]
            starts = np.cumsum(counts) - counts
            submission = found["submission_id"].astype(np.int64)
            if name == "dispatch-events":  # a GPU driver's: every record is a dispatch, timed in device ticks
                self.dispatch_families.add(name)
                self._dispatch_facts(found, np.ones(len(found), bool), submission, mine, counts, first_row,
                                     len(family))
                continue
            self.types.setdefault(name, set()).update(_distinct(found["type"]))
            execute = found["type"] == pf.QUEUE_OPS.index("execute")
            executions.append(np.stack([submission[execute], found["command_buffer_id"][execute]
                                        .astype(np.int64)], axis=1))
            if name == "queue-events":
                # Each flush's first submission is kept; its last only until the next
                # flush is checked against it (a flush must start after the one before).
                first, last = np.minimum.reduceat(submission, starts), np.maximum.reduceat(submission, starts)
                late = np.flatnonzero(first <= np.concatenate([[self.queue_last], last[:-1]]))
                if len(late) and self.late_flush is None:
                    self.late_flush = self.queue_chunks + int(late[0])
                self.queue_chunks += len(first)
                self.queue_last = int(last[-1])
                self.flush_starts.add(first)
                continue
            dispatch = found["type"] == pf.DISPATCH_TYPE
            if dispatch.any():
                self.dispatch_families.add(name)
                self._dispatch_facts(found, dispatch, submission, mine, counts, first_row, len(family))
        if executions:  # queue and host records name the same executions: distinct within the block
            self.executions.add(_distinct_pairs(np.concatenate(executions)) if len(executions) > 1 else executions[0])

    def _dispatch_facts(self, found: np.ndarray, dispatch: np.ndarray, submission: np.ndarray, mine: np.ndarray,
                        counts: np.ndarray, first_row: int, chunks: int) -> None:
        """The facts of a block's dispatch records (``found[dispatch]``, from the chunks
        ``mine`` of the block's ``chunks``, ``counts`` records each): how many, each
        buffer's first chunk, whether commands are numbered, each chunk's submissions."""
        self.dispatch_records += int(dispatch.sum())
        buffer_ids = found["command_buffer_id"][dispatch]
        # Buffer ids are small counters: counted, not sorted (the buffers are few).
        fresh = [buffer for buffer in _distinct(buffer_ids) if buffer not in self.buffers]
        chunk = np.repeat(np.flatnonzero(mine), counts)[dispatch]
        for buffer in fresh:
            self.buffers[buffer] = first_row + int(chunk[int(np.argmax(buffer_ids == buffer))])
        self.numbered |= bool((found["command_index"][dispatch] != NO_COMMAND_INDEX).any())
        low = np.full(chunks, _NO_SUBMISSION, np.int64)
        high = np.full(chunks, _BEFORE_ALL, np.int64)
        np.minimum.at(low, chunk, submission[dispatch])
        np.maximum.at(high, chunk, submission[dispatch])
        rows = np.flatnonzero(low != _NO_SUBMISSION)
        self.dispatch_bounds.add(np.stack([rows + first_row, low[rows], high[rows]], axis=1))


#: Values under this are counted (a bin each) where :func:`_distinct` is asked; past it, sorted.
COUNTED_BELOW = 1 << 20


def _distinct(values: np.ndarray) -> list[int]:
    """The distinct ``values`` (small unsigned counters and enum values: operation types,
    command-buffer ids), sorted: counted, not sorted, while they are small; a value past
    :data:`COUNTED_BELOW` (an unknown type, a damaged record) is sorted like the rest
    rather than given a bin of its own (a type of 2^32 - 1 asked for 32 GiB of bins)."""
    if not len(values):
        return []
    if int(values.max()) < COUNTED_BELOW:
        return np.flatnonzero(np.bincount(values)).tolist()
    return np.unique(values).tolist()


#: How much a profile being written grows before its follower walks on (a few flushes'
#: worth of records at a time costs more per record), and how often it looks.
FOLLOW_BYTES = 4 << 20
FOLLOW_POLL_SECONDS = 0.05
#: The file header's bytes the walk reads (magic, version, first record's offset, length).
FILE_HEADER_BYTES = 24


def follow_profile(path: Path, finished: threading.Event, paged: PagedArrays | None = None,
                   flushed: Callable[[int], None] | None = None,
                   walked: Callable[[_Walk, threading.Event], None] | None = None) -> _Walk | None:
    """Index ``path`` while the tool is still writing it, until ``finished`` is set (run
    in a thread of its own, on the core the tool leaves idle): the walk so far, which
    :func:`index_profile` takes on from where it stopped. ``None`` where the walk failed
    (a damaged or unknown file): the index then walks the file afresh and names what is
    wrong as it would have. ``paged``: where the walk's columns go (:class:`_Walk`);
    ``flushed``: told the invocations flushed so far as the walk goes (a progress bar);
    ``walked``: handed the walk after each step (:meth:`_Walk.follow`)."""
    walk = _Walk(Path(path), paged)
    try:
        walk.follow(finished, flushed, walked)
    except Exception:  # noqa: BLE001 — left to index_profile's own walk, which says what is wrong
        return None
    return walk


def index_profile(path: Path, window_records: int = WINDOW_RECORDS, followed: _Walk | None = None,
                  paged: PagedArrays | None = None) -> ProfileIndex:
    """The :class:`ProfileIndex` of ``path``: :class:`profile_file.ProfileFormatError` for
    a damaged file (naming the byte), :class:`WindowedRouteUnavailable` for a profile the
    windowed route leaves to the whole-run one. ``followed``: :func:`follow_profile`'s
    walk of ``path`` while it was written, taken on to the end (with its own ``paged``);
    ``paged``: where a fresh walk's columns go, and so the index's chunk table."""
    walk = followed if followed is not None and not followed.indexed else _Walk(Path(path), paged)
    walk.indexed = True
    walk.run()
    refused = _refusal(walk)
    if refused is not None:
        raise WindowedRouteUnavailable(refused)
    # The walk's columns, read back whole (mapped from its files, or its pieces joined and
    # handed back): at 1M invocations the pieces held 100 MiB beside their joined copies.
    index = _index_of(walk, walk.family.array(), walk.payload_at.joined(), walk.records.array(),
                      _device_column(walk.device), walk.flush_starts.array(), walk.executions.array(),
                      window_records, walk.paged, finished=True)
    del walk
    release_freed_memory(now=True)  # the join starts from the index, not from the walk's peak
    return index


def index_so_far(walk: _Walk, window_records: int = WINDOW_RECORDS) -> ProfileIndex | None:
    """The index of what ``walk`` has taken so far of a profile still being written (from
    the thread that walks it, between its steps: :meth:`_Walk.follow`'s ``walked``), its
    columns read as they are and left to grow: the windows before the last are those the
    finished file's index will have (a cut depends only on the chunks before it), the
    last may still grow. ``None`` where the windowed route would refuse the profile as it
    is so far (:func:`_refusal`), or where its records need the whole profile to be
    placed (a GPU driver's device ticks, fitted to the whole profile's clock samples).
    Its arrays beyond the walk's own are held in memory."""
    if _refusal(walk) is not None or walk.device_ticks or walk.dispatch_families - {"host-execution-events"}:
        return None
    return _index_of(walk, walk.family.so_far(), walk.payload_at.so_far(), walk.records.so_far(),
                     _device_column(list(walk.device)), walk.flush_starts.so_far(), walk.executions.so_far(),
                     window_records, PagedArrays(None), finished=False)


def _refusal(walk: _Walk) -> str | None:
    """Why the windowed route leaves the profile ``walk`` has walked to the whole-run
    route (``None``: it takes it on, as far as the walk can tell)."""
    if walk.dropped:
        return "the profiler dropped records"
    if len(walk.dispatch_families) > 1:
        return f"dispatch records in {' and '.join(sorted(walk.dispatch_families))}"
    if len(walk.queue_streams) > 1:
        return "queue events of several streams"
    unknown = {pf.QUEUE_OPS[t] if t < len(pf.QUEUE_OPS) else str(t)
               for t in walk.types.get("host-execution-events", set())} - {"dispatch"}
    from dfit_mlir.runtime_hooks.hal_profile import NON_MODEL_OPERATIONS

    if unknown - NON_MODEL_OPERATIONS:
        return f"host operations {sorted(unknown - NON_MODEL_OPERATIONS)}"
    if walk.late_flush is not None:
        return f"flush {walk.late_flush} holds a submission before the previous flush's last"
    return None


def _index_of(walk: _Walk, family: np.ndarray, payload_at: ChunkOffsets, records: np.ndarray, device: np.ndarray,
              flush_starts: np.ndarray, execution_pairs: np.ndarray, window_records: int,
              paged: PagedArrays, *, finished: bool) -> ProfileIndex:
    """The :class:`ProfileIndex` of ``walk``'s columns (given as read back: whole, or so
    far); ``paged``: where the index's own arrays go. ``finished``: the walk is done, and
    every dispatch record is checked to lie within a window of its owner (a walk still
    going is checked once done, by the index its run is joined with)."""
    window_chunks, owned = _windows(family, records, flush_starts, window_records, walk.paged)
    if finished:
        _check_look_ahead(walk, window_chunks, owned)
    executions = _distinct_executions(execution_pairs, paged)
    del execution_pairs
    counts = _records_per_family(family, records, walk.paged)
    return ProfileIndex(
        path=walk.path, version=walk.version, chunk_family=family, chunk_payload_at=payload_at,
        chunk_records=records,
        window_chunks=window_chunks, window_submissions=owned, functions=walk.functions,
        executions=executions, flush_starts=flush_starts,
        types={name: np.array(sorted(values), np.int64) for name, values in walk.types.items()}, counts=counts,
        numbered=walk.numbered, dispatch_records=walk.dispatch_records,
        first_buffer_windows=_near(window_chunks, np.array(list(walk.buffers.values()), np.int64)),
        read_stats={"chunks": len(family), "blocks": walk.blocks},
        chunk_device=device,
        dispatch_family=next(iter(walk.dispatch_families), "host-execution-events"),
        clocks=walk.clocks.fits() if walk.device_ticks else None)


def _windows(family: np.ndarray, records: np.ndarray, flush_starts: np.ndarray, window_records: int,
             paged: PagedArrays | None = None, step: int = 1 << 18) -> tuple[np.ndarray, np.ndarray]:
    """(the chunk row where each window begins, and one past the last; the first
    submission each window owns): a window is cut before a queue-events chunk once it
    holds ``window_records`` records; ``flush_starts``: each queue chunk's first submission.
    The chunks are read ``step`` at a time (the queue chunks' rows and the records
    before each, whole, were 16 bytes a queue chunk: 16 MiB at 1M invocations), the
    pages of those in ``paged``'s files handed back as they are read."""
    cuts, owned = [0], [_BEFORE_ALL]
    threshold = window_records  # records before the next cut: at least this many
    before = queue_before_piece = 0  # records and queue chunks before the piece
    pieces = (paged or PagedArrays(None)).pieces(family, records, step=step)  # (pages handed back as read)
    for begin, (family_piece, records_piece) in zip(range(0, len(family), step), pieces, strict=True):
        counts = records_piece.astype(np.int64)
        rows = np.flatnonzero(family_piece == QUEUE)
        # Records before each queue chunk: non-decreasing, so each cut (the first queue
        # chunk after the last cut with window_records more records before it) is a
        # binary search, not a scan of every queue chunk per window (1.3 s at 1M invocations).
        queue_before = before + (np.cumsum(counts) - counts)[rows]
        at = 0
        while (at := at + int(np.searchsorted(queue_before[at:], threshold))) < len(rows):
            cuts.append(begin + int(rows[at]))
            owned.append(int(flush_starts[queue_before_piece + at]))
            threshold = int(queue_before[at]) + window_records
            at += 1
        before += int(counts.sum())
        queue_before_piece += len(rows)
    return np.array([*cuts, len(family)], np.int64), np.array(owned, np.int64)


def _records_per_family(family: np.ndarray, records: np.ndarray, paged: PagedArrays,
                        step: int = 1 << 18) -> dict[str, int]:
    """Records of each family with a chunk, counted ``step`` chunks at a time (the pages
    of those in ``paged``'s files handed back as they are read; the whole table's float
    weights were 8 bytes a chunk: 24 MiB at 1M invocations)."""
    records_of, chunks_of = np.zeros(len(pf.FAMILIES), np.int64), np.zeros(len(pf.FAMILIES), np.int64)
    for family_piece, records_piece in paged.pieces(family, records, step=step):
        # (exact: a piece's records of a family are far under 2^53)
        records_of += np.bincount(family_piece, weights=records_piece, minlength=len(pf.FAMILIES)).astype(np.int64)
        chunks_of += np.bincount(family_piece, minlength=len(pf.FAMILIES))
    return {pf.FAMILIES[code]: int(records_of[code]) for code in np.flatnonzero(chunks_of).tolist()}


def _device_column(parts: list[np.ndarray]) -> np.ndarray:
    """Each chunk's device from the walk's per-block ``parts`` (emptied): one value for
    the whole file as a zero-stride view where every block held that one value."""
    one_each = all(len(part) <= 1 or part.strides == (0,) for part in parts)  # the walk's constant blocks
    if parts and one_each and len({int(part[0]) for part in parts}) == 1:
        column = np.broadcast_to(parts[0][:1].copy(), (sum(len(part) for part in parts),))
        parts.clear()
        return column
    return _joined(parts, np.zeros(0, np.int32))


def _joined(parts: list[np.ndarray], empty: np.ndarray) -> np.ndarray:
    """``parts`` concatenated (``empty`` for none), and ``parts`` emptied and handed back:
    the walk's block-sized pieces sit in glibc's heap (under the mmap threshold), so freed
    they stay resident, and each column joined on top of them raised the index's peak (by
    70 MiB at 1M invocations, the five columns' pieces: measured 218 against 148 after the
    walk, standalone)."""
    joined = np.concatenate(parts) if parts else empty
    pieces = len(parts)
    parts.clear()
    if pieces > 1:
        release_freed_memory(now=True)
    return joined


#: Bits of a command buffer id in a packed (submission, command buffer) pair.
_BUFFER_BITS = 20


def _packed(pairs: np.ndarray, paged: PagedArrays | None = None, step: int = 1 << 18) -> np.ndarray | None:
    """The rows of ``pairs`` (submission, command buffer) each packed into one integer
    (``submission << 20 | buffer``), in order, read ``step`` rows at a time (``paged``:
    the pages of pairs it keeps in a file handed back as they are read); ``None``
    where the values do not fit."""
    packed = np.empty(len(pairs), np.int64)
    for begin, (piece,) in zip(range(0, len(pairs), step), (paged or PagedArrays(None)).pieces(pairs, step=step),
                               strict=True):
        if piece.min() < 0 or piece[:, 1].max() >= 1 << _BUFFER_BITS or piece[:, 0].max() >= 1 << (63 - _BUFFER_BITS):
            return None
        out = packed[begin:begin + len(piece)]
        np.left_shift(piece[:, 0], _BUFFER_BITS, out=out)
        out |= piece[:, 1]
    return packed


def _distinct_pairs(pairs: np.ndarray) -> np.ndarray:
    """``np.unique(pairs, axis=0)`` (sorted distinct rows), packed into one integer per
    row where the values allow (the row-wise sort costs a hundred times more)."""
    packed = _packed(pairs)
    if packed is None:
        return np.unique(pairs, axis=0)
    packed = packed[:distinct_in_place(packed)]
    return np.stack([packed >> _BUFFER_BITS, packed & ((1 << _BUFFER_BITS) - 1)], axis=1)


def _distinct_executions(pairs: np.ndarray, paged: PagedArrays, step: int = 1 << 18) -> Executions:
    """The :class:`Executions` of the distinct rows of ``pairs``, sorted: packed, sorted
    and made distinct in place (one array of 8 bytes a row), then unpacked ``step`` rows
    at a time into two columns that ``paged`` keeps (a run's pairs stacked once more
    were 15 MiB at 1M invocations, their distinct rows sorted beside them 16 more)."""
    packed = _packed(pairs, paged, step)
    if packed is None:
        found = np.unique(pairs, axis=0)
        return Executions(found[:, 0].copy(), found[:, 1].copy())
    del pairs
    count = distinct_in_place(packed, step)
    submission = paged.full("execution_submissions", count, 0, np.int64)
    buffer = paged.full("execution_buffers", count, 0, np.int64)
    for begin in range(0, count, step):
        part = packed[begin:min(count, begin + step)]
        submission[begin:begin + len(part)] = part >> _BUFFER_BITS
        buffer[begin:begin + len(part)] = part & ((1 << _BUFFER_BITS) - 1)
        paged.release()
    return Executions(submission, buffer)


def _near(window_chunks: np.ndarray, chunk_rows: np.ndarray) -> tuple[int, ...]:
    """The windows holding ``chunk_rows`` and their neighbours (a record's submission is
    owned by its window or the one before or after: :func:`_check_look_ahead`)."""
    windows = np.searchsorted(window_chunks, chunk_rows, side="right") - 1
    near = sorted_distinct(np.concatenate([windows - 1, windows, windows + 1]))
    return tuple(near[(near >= 0) & (near < len(window_chunks) - 1)].tolist())


def _check_look_ahead(walk: _Walk, window_chunks: np.ndarray, owned: np.ndarray) -> None:
    """Every dispatch record within one window of the window that owns its submission
    (the walk's blocks' bounds checked a few hundred thousand chunks at a time, not
    joined: 24 bytes a chunk and three temporaries as large at 1M invocations)."""
    for bounds in walk.dispatch_bounds.groups(LOOK_AHEAD_ROWS):
        window = np.searchsorted(window_chunks, bounds[:, 0], side="right") - 1
        # Owner of a submission: the last window whose first owned submission is <= it.
        low_owner = np.searchsorted(owned, bounds[:, 1], side="right") - 1
        high_owner = np.searchsorted(owned, bounds[:, 2], side="right") - 1
        far = np.flatnonzero((low_owner < window - 1) | (high_owner > window + 1))
        if len(far):
            row = int(far[0])
            raise WindowedRouteUnavailable(
                f"dispatch records of submissions {int(bounds[row, 1])}..{int(bounds[row, 2])} were written more "
                f"than one window ({int(window_chunks[1] - window_chunks[0])} chunks) away from their submission's "
                f"window")


#: Chunks whose dispatch bounds :func:`_check_look_ahead` checks at once.
LOOK_AHEAD_ROWS = 1 << 18


def dispatch_windows(index: ProfileIndex, windows: Sequence[int] | None = None,
                     reads: WindowReads | None = None) -> Iterator[tuple[int, DispatchColumns]]:
    """(window, the dispatch records of the submissions it owns, in runtime order), for
    each of ``windows`` (default: all) in order: a window's records are taken from its own
    chunks and its neighbours' (the look-ahead of the module doc); each window's
    dispatch records are read once and dropped when no later window needs them. Given
    ``reads`` (which must read :attr:`ProfileIndex.dispatch_family`), the records come
    from it, and it holds each window yielded until the next is (the caller reads the
    window's other families from it meanwhile)."""
    from dfit_mlir.runtime_hooks.hal_profile import _dispatch_columns

    wanted = range(index.windows) if windows is None else windows
    family = index.dispatch_family
    reads = WindowReads(index, [(family,)]) if reads is None else reads
    cache: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]] = {}

    def dispatches(window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """A window's records of the dispatch family as ``reads`` holds them (not
        copied: they are held there anyway, and a filtered copy would be held beside them),
        each one's device and submission, and which are dispatches (``None``: all)."""
        if window not in cache:
            found, devices = reads(window, family), index.family_devices(family, window)
            dispatch = found["type"] == pf.DISPATCH_TYPE if family == "host-execution-events" else None
            cache[window] = found, devices, found["submission_id"].astype(np.int64), dispatch
        return cache[window]

    for window in wanted:
        first, end = index.owned(window)
        parts, devices = [], []
        for near in (window - 1, window, window + 1):
            if 0 <= near < index.windows:
                found, device, submission, dispatch = dispatches(near)
                owned = (submission >= first) & (submission < end)
                if dispatch is not None:
                    owned &= dispatch
                parts.append(found[owned])
                devices.append(device[owned])
        for old in [k for k in cache if k < window]:
            del cache[old]
        reads.forget_before(window)
        records = np.concatenate(parts) if parts else np.zeros(0, pf.FAMILY_DTYPES[family])
        # One "chunk" per record: each keeps its own chunk's device.
        tables = pf.ProfileTables(index.path, index.version, records={family: records}, functions=index.functions,
                                  chunk_starts={family: np.arange(len(records))},
                                  chunk_devices={family: np.concatenate(devices) if devices
                                                 else np.zeros(0, np.int32)})
        yield window, _dispatch_columns(tables, index.clocks)


def row_labels(index: ProfileIndex, family: str, prefix: str | None, exclude: Sequence[int] = ()) -> tuple[str, ...]:
    """The event names a family's rows get over the whole run (``RowColumns.of``'s, sorted
    as there), so that every window's rows share one table."""
    table = pf.MEMORY_EVENT_TYPES if family == "memory-events" else pf.QUEUE_OPS
    values = [int(t) for t in index.types.get(family, np.zeros(0, np.int64)).tolist() if int(t) not in exclude]
    names = sorted({str(pf.names(np.array([value]), table)[0]) for value in values})
    return tuple(f"{prefix} {name}" if prefix else name for name in names)


def tables_of(index: ProfileIndex, family: str, records: np.ndarray) -> Any:
    """A :class:`profile_file.ProfileTables` holding one window's ``records`` of ``family``
    (what ``profile_file``'s record builders read)."""
    return pf.ProfileTables(index.path, index.version, records={family: records}, functions=index.functions)
