"""One reader of IREE's raw HAL profile bundle (``.ireeprof``): every event family
straight into typed columns, with no subprocess and no Python object per record.

The layout is IREE's, pinned with static asserts (``iree/hal/utils/profile_file.h``:
a 24-byte file header — magic ``IRPF``, ``version_major`` / ``version_minor`` u16,
``header_length`` u32, ``flags`` u32, ``file_length`` u64 — then records, each a
104-byte header followed by its content type, its name and its payload). A chunk's
payload is a run of fixed-size records of one family (``iree/hal/profile_schema.h``);
each starts with its own ``record_length`` (u32), which must be the size this reader
knows for the family. The executable-function metadata records are the one
variable-length kind (their name follows the fixed part).

:class:`ProfileFileReader` reads the file once, a block at a time (:class:`BlockReader`,
the next block read in a thread while this one is walked): each block's record headers
are found and checked in bulk (:func:`walk_block`, which the windowed route's index
walks with too: one reader of the layout), and each family's records are gathered
straight into one array of its numpy structured dtype (:data:`FAMILY_DTYPES`) with
fancy indexes, no Python per record or per chunk (1M records in about 0.1 s on the
2-core machine, ``benchmarks/long_runs.py --decode-records``). What :mod:`hal_profile`
made of ``iree-profile``'s JSON lines is rebuilt from those columns
(:class:`ProfileTables`); ``iree-profile`` stays the reference in the tests
(``tests/test_profile_file.py``: field by field on real profiles).

Only the format version this reader was written against (:data:`KNOWN_VERSIONS`, the
version IREE 3.13 writes) is read; any other is :class:`ProfileFormatVersionError`, and
the caller falls back to ``iree-profile``. A damaged file (wrong magic, a record that
runs past the end, a family record of the wrong size) is :class:`ProfileFormatError`
naming the file and the byte offset.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Collection, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

#: ``IREE_HAL_PROFILE_FILE_MAGIC``.
MAGIC = b"IRPF"
#: (major, minor) file-format versions whose layout this reader knows: IREE 3.13 writes 1.6.
KNOWN_VERSIONS = frozenset({(1, 6)})
KNOWN_VERSIONS_TEXT = ", ".join(f"{major}.{minor}" for major, minor in sorted(KNOWN_VERSIONS))
#: The runtime package (and version) whose profiles were checked field by field.
PINNED_RUNTIME = ("iree-base-runtime", "3.13.0")
CONTENT_PREFIX = "application/vnd.iree.hal.profile."
#: ``iree_hal_profile_file_record_type_t``: session begin, chunk, session end.
RECORD_TYPE_SESSION_BEGIN, RECORD_TYPE_CHUNK, RECORD_TYPE_SESSION_END = 1, 2, 3
RECORD_TYPES = frozenset({RECORD_TYPE_SESSION_BEGIN, RECORD_TYPE_CHUNK, RECORD_TYPE_SESSION_END})
#: Every chunk content type (after :data:`CONTENT_PREFIX`) the pinned runtime writes: the
#: ``application/vnd.iree.hal.profile.*`` strings of iree-base-runtime 3.13.0's libraries
#: (``iree/hal/profile_schema.h``). Those beside the event families and the function
#: names are metadata a run does not need; a chunk of any other type in a 1.6 file is
#: damage, not a newer layout (that would be a new format version).
KNOWN_CHUNK_TYPES = frozenset({
    "clock-correlations", "command-buffers", "command-operations", "command-region-events", "counter-samples",
    "counter-sets", "counters", "device-metric-descriptors", "device-metric-samples", "device-metric-sources",
    "devices", "dispatch-events", "event-relationships", "executable-code-object-loads", "executable-code-objects",
    "executable-functions", "executable-traces", "executables", "host-execution-events", "memory-events",
    "queue-device-events", "queue-events", "queues", "session",
})
#: ``IREE_HAL_PROFILE_CHUNK_FLAG_TRUNCATED``.
CHUNK_FLAG_TRUNCATED = 1
_FILE_HEADER = struct.Struct("<4sHHIIQ")  # 24 bytes
_RECORD_HEADER = struct.Struct("<QQQQQQQIIIIIxxxxQQIHH")  # 104 bytes
#: Queue operation names (``iree_profile_queue_event_type_name``), by type value.
QUEUE_OPS = ("none", "barrier", "dispatch", "execute", "copy", "fill", "update", "read", "write", "alloca",
             "dealloca", "host_call")
DEPENDENCY_STRATEGIES = ("none", "inline", "device_barrier", "software_defer")
MEMORY_EVENT_TYPES = ("none", "slab_acquire", "slab_release", "pool_reserve", "pool_materialize", "pool_release",
                      "pool_wait", "queue_alloca", "queue_dealloca", "buffer_allocate", "buffer_free",
                      "buffer_import", "buffer_unimport")
#: ``IREE_HAL_PROFILE_QUEUE_EVENT_TYPE_DISPATCH``.
DISPATCH_TYPE = 2
NO_INDEX = 0xFFFFFFFF


def _dtype(*fields: tuple[str, str]) -> np.dtype:
    return np.dtype([(name, "<" + kind) for name, kind in fields])


_U32, _U64, _I64 = "u4", "u8", "i8"
#: Each event family's record (``iree/hal/profile_schema.h``), by content-type suffix.
FAMILY_DTYPES: dict[str, np.dtype] = {
    "queue-events": _dtype(
        ("record_length", _U32), ("type", _U32), ("flags", _U32), ("dependency_strategy", _U32),
        ("event_id", _U64), ("host_time_ns", _I64), ("submission_id", _U64), ("command_buffer_id", _U64),
        ("allocation_id", _U64), ("stream_id", _U64), ("physical_device_ordinal", _U32), ("queue_ordinal", _U32),
        ("wait_count", _U32), ("signal_count", _U32), ("barrier_count", _U32), ("operation_count", _U32),
        ("payload_length", _U64), ("ready_host_time_ns", _I64)),
    "host-execution-events": _dtype(
        ("record_length", _U32), ("type", _U32), ("flags", _U32), ("status_code", _U32), ("event_id", _U64),
        ("submission_id", _U64), ("command_buffer_id", _U64), ("executable_id", _U64), ("allocation_id", _U64),
        ("stream_id", _U64), ("physical_device_ordinal", _U32), ("queue_ordinal", _U32), ("command_index", _U32),
        ("function_ordinal", _U32), ("wg_x", _U32), ("wg_y", _U32), ("wg_z", _U32), ("ws_x", _U32),
        ("ws_y", _U32), ("ws_z", _U32), ("start_host_time_ns", _I64), ("end_host_time_ns", _I64),
        ("payload_length", _U64), ("tile_count", _U64), ("tile_duration_sum_ns", _I64),
        ("operation_count", _U32), ("reserved0", _U32)),
    "memory-events": _dtype(
        ("record_length", _U32), ("type", _U32), ("flags", _U32), ("result", _U32), ("event_id", _U64),
        ("host_time_ns", _I64), ("allocation_id", _U64), ("pool_id", _U64), ("backing_id", _U64),
        ("submission_id", _U64), ("physical_device_ordinal", _U32), ("queue_ordinal", _U32),
        ("frontier_entry_count", _U32), ("reserved0", _U32), ("memory_type", _U64), ("buffer_usage", _U64),
        ("offset", _U64), ("length", _U64), ("alignment", _U64), ("pool_bytes_reserved", _U64),
        ("pool_bytes_free", _U64), ("pool_bytes_committed", _U64), ("pool_budget_limit", _U64),
        ("pool_reservation_count", _U32), ("pool_slab_count", _U32)),
    "dispatch-events": _dtype(
        ("record_length", _U32), ("flags", _U32), ("event_id", _U64), ("submission_id", _U64),
        ("command_buffer_id", _U64), ("executable_id", _U64), ("command_index", _U32),
        ("function_ordinal", _U32), ("wg_x", _U32), ("wg_y", _U32), ("wg_z", _U32), ("ws_x", _U32),
        ("ws_y", _U32), ("ws_z", _U32), ("start_tick", _U64), ("end_tick", _U64)),
    "queue-device-events": _dtype(
        ("record_length", _U32), ("type", _U32), ("flags", _U32), ("reserved0", _U32), ("event_id", _U64),
        ("submission_id", _U64), ("command_buffer_id", _U64), ("allocation_id", _U64), ("stream_id", _U64),
        ("payload_length", _U64), ("physical_device_ordinal", _U32), ("queue_ordinal", _U32),
        ("operation_count", _U32), ("reserved1", _U32), ("start_tick", _U64), ("end_tick", _U64)),
    "clock-correlations": _dtype(
        ("record_length", _U32), ("flags", _U32), ("physical_device_ordinal", _U32), ("reserved0", _U32),
        ("sample_id", _U64), ("device_tick", _U64), ("host_cpu_timestamp_ns", _U64),
        ("host_system_timestamp", _U64), ("host_system_frequency_hz", _U64), ("host_time_begin_ns", _I64),
        ("host_time_end_ns", _I64)),
}
#: Sizes IREE pins for these records (``static_assert`` in profile_schema.h's users).
FAMILY_SIZES = {"queue-events": 104, "host-execution-events": 152, "memory-events": 160, "dispatch-events": 88,
                "queue-device-events": 96, "clock-correlations": 72}
#: The fixed part of ``iree_hal_profile_executable_function_record_t`` (the name follows).
_FUNCTION_RECORD = struct.Struct("<IIQIIIIIIIIQQ")  # 64 bytes
#: ``IREE_HAL_PROFILE_CLOCK_CORRELATION_FLAG_DEVICE_TICK`` / ``..._HOST_TIME_BRACKET``.
CLOCK_DEVICE_TICK, CLOCK_HOST_BRACKET = 1, 8
if any(FAMILY_DTYPES[name].itemsize != size for name, size in FAMILY_SIZES.items()):
    raise AssertionError("a family dtype does not have the size IREE pins")


class ProfileFormatError(ValueError):
    """The file is not a HAL profile bundle this reader can read (damaged or truncated)."""


class ProfileFormatVersionError(ProfileFormatError):
    """The file is a HAL profile bundle of a format version this reader does not know."""


@dataclass
class ProfileTables:
    """Every event family of one ``.ireeprof`` as a structured array (records in file
    order), with the chunk each record came from, and the metadata the decode needs."""

    path: Path
    version: tuple[int, int]
    #: family (content-type suffix) -> structured array of :data:`FAMILY_DTYPES`.
    records: dict[str, np.ndarray] = field(default_factory=dict)
    #: family -> row where each of its chunks begins (one chunk per flush and family).
    chunk_starts: dict[str, np.ndarray] = field(default_factory=dict)
    #: family -> stream id of each chunk.
    chunk_streams: dict[str, np.ndarray] = field(default_factory=dict)
    #: family -> physical device ordinal of each chunk (its record header's).
    chunk_devices: dict[str, np.ndarray] = field(default_factory=dict)
    #: family -> records the producer dropped (truncated chunks).
    dropped: dict[str, int] = field(default_factory=dict)
    #: (executable_id, function_ordinal) -> export name (the dispatch records' ``key``).
    functions: dict[tuple[int, int], str] = field(default_factory=dict)

    def family(self, name: str) -> np.ndarray:
        """The records of family ``name`` (empty when the profile has none)."""
        found = self.records.get(name)
        return found if found is not None else np.zeros(0, FAMILY_DTYPES[name])

    def devices(self, name: str) -> np.ndarray:
        """The physical device ordinal of each record of family ``name`` (its chunk's)."""
        starts = self.chunk_starts.get(name)
        if starts is None:
            return np.zeros(0, np.int64)
        counts = np.diff(np.append(starts, len(self.records[name])))
        return np.repeat(self.chunk_devices[name], counts)

    def keys(self, executable_id: np.ndarray, function_ordinal: np.ndarray) -> tuple[np.ndarray, tuple[str, ...]]:
        """(code of each record's export name, the names): the dispatch records' ``key``
        as ``iree-profile`` resolves it (missing metadata is an error, as there)."""
        packed = executable_id.astype(np.uint64) << np.uint64(32) | function_ordinal.astype(np.uint64)
        distinct, inverse = np.unique(packed, return_inverse=True)
        names = []
        for value in distinct.tolist():
            pair = (value >> 32, value & 0xFFFFFFFF)
            name = self.functions.get(pair)
            if not name:
                raise ProfileFormatError(f"{self.path}: a dispatch record references executable {pair[0]} function "
                                         f"{pair[1]}, which the profile's executable metadata does not name")
            names.append(name)
        return inverse.ravel().astype(np.int32), tuple(names)


def check_record_kind(path: Path, offset: int, record_type: int, content: str) -> None:
    """Refuse a record of a type, or a chunk of a content type (``content``, after
    :data:`CONTENT_PREFIX`), that the pinned format does not define: a damaged file."""
    if record_type not in RECORD_TYPES:
        raise ProfileFormatError(f"{path}: the record at byte {offset} has record type {record_type}, which HAL "
                                 f"profile format {KNOWN_VERSIONS_TEXT} does not define: the file is damaged")
    if record_type == RECORD_TYPE_CHUNK and content not in KNOWN_CHUNK_TYPES:
        raise ProfileFormatError(f"{path}: the chunk at byte {offset} has content type {content!r}, which HAL "
                                 f"profile format {KNOWN_VERSIONS_TEXT} ({PINNED_RUNTIME[0]}=={PINNED_RUNTIME[1]}) does not define: "
                                 f"the file is damaged")


#: The event families by code: the bulk walk (:func:`walk_block`) and the index store
#: each chunk's content as a small integer.
FAMILIES = tuple(FAMILY_DTYPES)
FAMILY_CODES = {family: code for code, family in enumerate(FAMILIES)}
#: Content code of the executable-function metadata chunks (after the event families),
#: and of the other chunk types the format defines (metadata no reader here needs).
FUNCTIONS_CODE = len(FAMILIES)
METADATA_CODE = FUNCTIONS_CODE + 1
_CONTENT_CODES = {(CONTENT_PREFIX + family).encode(): code for family, code in FAMILY_CODES.items()}
_CONTENT_CODES[(CONTENT_PREFIX + "executable-functions").encode()] = FUNCTIONS_CODE
_CONTENT_CODES.update({(CONTENT_PREFIX + kind).encode(): METADATA_CODE for kind in KNOWN_CHUNK_TYPES
                       if (CONTENT_PREFIX + kind).encode() not in _CONTENT_CODES})


@dataclass(frozen=True)
class _ContentTypes:
    """The content types of one length, compared as little-endian 8-byte words at byte
    offsets that cover the type (the last overlapping the one before: every type is
    longer than :data:`CONTENT_PREFIX`'s 33 bytes): the words all of them share once, then
    each type's own. Whole raw values compared byte by byte took 16 ms of the 0.1 s read
    of a 1M-record profile (136k chunks); the words, 7."""

    shared: tuple[tuple[int, np.uint64], ...]  # (offset, word) the types of this length all have
    own: tuple[tuple[tuple[tuple[int, np.uint64], ...], int], ...]  # each type's other words, and its code

    @classmethod
    def of(cls, contents: dict[bytes, int]) -> _ContentTypes:
        length = len(next(iter(contents)))
        offsets = sorted({min(at, length - 8) for at in range(0, length, 8)})
        words = {content: [(at, np.uint64(int.from_bytes(content[at:at + 8], "little"))) for at in offsets]
                 for content in contents}
        shared = set.intersection(*(set(found) for found in words.values()))
        own = tuple((tuple(word for word in words[content] if word not in shared), code)
                    for content, code in contents.items())
        return cls(tuple(sorted(shared)), own)

    def codes(self, text: np.ndarray, rows: np.ndarray, codes: np.ndarray) -> None:
        """Into ``codes[rows]``: the code of each of ``text`` (a row of bytes a content
        type of this length) that is one of these types."""
        def word(at: int) -> np.ndarray:
            return text[:, at:at + 8].view("<u8")[:, 0]  # unaligned: numpy reads them as such

        shared = np.ones(len(rows), bool)
        for at, value in self.shared:
            shared &= word(at) == value
        for own, code in self.own:
            same = shared.copy()
            for at, value in own:
                same &= word(at) == value
            codes[rows[same]] = code


#: Content type length -> its types (:class:`_ContentTypes`).
_CONTENT_BY_LENGTH = {length: _ContentTypes.of({content: code for content, code in _CONTENT_CODES.items()
                                                if len(content) == length})
                      for length in sorted({len(content) for content in _CONTENT_CODES})}
_RECORD_TYPE_VALUES = np.array(sorted(RECORD_TYPES))
#: Each content code's record size (1 for the metadata codes: not records of a size).
ITEM_SIZES = np.array([FAMILY_SIZES[family] for family in FAMILIES] + [1, 1], np.int64)
#: The record header's fields the bulk walk reads: record_length, payload_length,
#: stream_id, header_length, content_type_length, name_length, physical_device_ordinal,
#: chunk_flags, dropped_record_count, record_type (:data:`_RECORD_HEADER`).
HEADER_DTYPE = np.dtype({
    "names": ["length", "payload_length", "stream_id", "header_length", "type_length", "name_length", "device",
              "flags", "dropped", "record_type"],
    "formats": ["<u8", "<u8", "<u8", "<u4", "<u4", "<u4", "<u4", "<u8", "<u8", "<u2"],
    "offsets": [0, 8, 24, 56, 60, 64, 68, 80, 88, 100], "itemsize": _RECORD_HEADER.size})
HEADER_BYTES = _RECORD_HEADER.size
_LENGTH = struct.Struct("<Q")
#: Bytes read per ``pread`` (a record larger than this is read alone).
BLOCK_BYTES = 8 << 20
#: Records the walk predicts at once from the last flush's record lengths (:func:`_leap`).
LEAP_RECORDS = 4096


#: Room kept before each block read ahead for the record the block before cut off (a
#: record is a few hundred bytes; a longer one is read again, whole, from where it starts).
CARRY_BYTES = 1 << 20


class BlockReader:
    """A file's bytes a block at a time, into two reused buffers: a read copies from the
    page cache at memory speed where mapping each block paid a page fault per page
    (0.25 s -> 0.13 s for the index of a 1M-record profile). With ``ahead``, the bytes
    after each block handed out are read in a thread while the caller walks it
    (``os.preadv`` lets go of the GIL, so the copy overlaps the walk's numpy work on
    the other core); the next block is then the record the last one cut off, copied in
    front of those bytes. What is handed out is valid until the next read: the caller
    copies what it keeps. ``close`` (or the ``with`` block's end) lets the thread go."""

    def __init__(self, ahead: bool = False) -> None:
        self.ahead = ahead
        self._buffers = [np.empty(0, np.uint8), np.empty(0, np.uint8)]
        #: The buffer, file offset and bytes of the block handed out last.
        self._out, self._out_at, self._out_block = 0, 0, np.empty(0, np.uint8)
        #: (fd, from, to, the read into the other buffer) of the bytes after it.
        self._pending: tuple[int, int, int, Future[int]] | None = None
        self._pool: ThreadPoolExecutor | None = None

    def __enter__(self) -> BlockReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(self, path: Path, fd: int, offset: int, stop: int, end: int, what: str) -> np.ndarray:
        """Bytes ``[offset, stop)`` of the file (more where read ahead), whose records
        end at ``end``: :class:`ProfileFormatError` if the file ends before ``stop``."""
        block = self._from_ahead(fd, offset, stop)
        if block is None:
            self._settle()  # the spare buffer is about to be read into
            spare = 1 - self._out
            block = self._room(spare, CARRY_BYTES + stop - offset)[CARRY_BYTES:]
            got = os.preadv(fd, [block], offset)
            if got < len(block):
                raise ProfileFormatError(f"{path}: the file ends at byte {offset + got}, before byte {stop}, {what}")
            self._out = spare
        self._out_at, self._out_block = offset, block
        if self.ahead and offset + len(block) < end:
            self._read_ahead(fd, offset + len(block), min(end, offset + len(block) + BLOCK_BYTES))
        return block

    def close(self) -> None:
        self._settle()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        self._buffers = [np.empty(0, np.uint8), np.empty(0, np.uint8)]
        self._out_block = np.empty(0, np.uint8)

    def _room(self, which: int, size: int) -> np.ndarray:
        if len(self._buffers[which]) < size:
            self._buffers[which] = np.empty(size, np.uint8)
        return self._buffers[which][:size]

    def _read_ahead(self, fd: int, start: int, stop: int) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="dfit-profile-read")
        target = self._room(1 - self._out, CARRY_BYTES + stop - start)[CARRY_BYTES:]
        self._pending = (fd, start, stop, self._pool.submit(os.preadv, fd, [target], start))

    def _from_ahead(self, fd: int, offset: int, stop: int) -> np.ndarray | None:
        """The block at ``offset``: the bytes read ahead, after what the block handed
        out last holds past ``offset``; ``None`` where they do not make it (another
        file, a block not next, more carried than there is room for, short of ``stop``)."""
        if self._pending is None:
            return None
        pending_fd, start, ahead_stop, read = self._pending
        self._pending = None
        got = read.result()
        carried = start - offset
        if pending_fd != fd or offset < self._out_at or not 0 <= carried <= CARRY_BYTES \
                or got < ahead_stop - start or stop > ahead_stop:
            return None
        spare = 1 - self._out
        buffer = self._buffers[spare]
        buffer[CARRY_BYTES - carried:CARRY_BYTES] = self._out_block[offset - self._out_at:]
        self._out = spare
        return buffer[CARRY_BYTES - carried:CARRY_BYTES + got]

    def _settle(self) -> None:
        """Let a read ahead that will not be used finish (its buffer is the spare one)."""
        if self._pending is not None:
            self._pending[3].result()
            self._pending = None


def walked_blocks(path: Path, fd: int, offset: int, end: int, reader: BlockReader, *,
                  following: bool = False) -> Iterator[tuple[np.ndarray, int, BlockRecords]]:
    """(block, its offset in the file, its records: :func:`walk_block`) from record
    ``offset`` to ``end``, each block of whole records (a record larger than
    :data:`BLOCK_BYTES` is read alone). ``following`` (a file still written, ``end`` its
    size so far): the walk ends at the first record not yet whole, to go on from there."""
    while offset < end:
        if offset + HEADER_BYTES > end:
            if following:
                return
            raise ProfileFormatError(f"{path}: a record header at byte {offset} runs past the end ({end}): the file "
                                     f"is truncated")
        (length,) = _LENGTH.unpack(os.pread(fd, _LENGTH.size, offset))
        stop = min(end, offset + max(BLOCK_BYTES, length))
        block = reader.read(path, fd, offset, stop, end, "where the header says it ends")
        found = walk_block(path, block, offset, end, following=following)
        if not found.walked:  # following: the next record is not whole yet (else walk_block raised)
            return
        yield block, offset, found
        offset += found.walked


def items_at(data: bytes | np.ndarray | mmap.mmap, offsets: np.ndarray, size: int) -> np.ndarray:
    """The ``size``-byte items of ``data`` starting at each of ``offsets``, copied, as
    raw ``V{size}`` values (view them as the record dtype). Every byte offset of the
    buffer is viewed as an item start (a 1-byte stride), so the fancy index copies an
    item at a time: twice as fast as indexing the rows of a strided byte matrix, which
    copies byte by byte."""
    starts = max(0, len(data) - size + 1)
    return np.ndarray(shape=(starts,), dtype=np.dtype((np.void, size)), buffer=data,  # type: ignore[call-overload]
                      strides=(1,))[offsets]


def _record_offsets(payload_at: np.ndarray, records: np.ndarray, size: int) -> np.ndarray:
    """The offset of every record of the chunks at ``payload_at`` (``records`` each)."""
    within = np.arange(int(records.sum())) - np.repeat(np.cumsum(records) - records, records)
    return np.repeat(payload_at, records) + within * size


#: Records gathered at a time into a caller's array (:func:`gather`'s ``into``): the
#: temporary each piece passes through stays under 1 MiB instead of a block's records
#: (the whole-file read of 1M records, best of five: 0.098–0.103 s at pieces of 1,024 to 2^30
#: records: the size is for memory, not speed).
GATHER_PIECE = 4096


def gather(path: Path, data: bytes | np.ndarray | mmap.mmap, base: int, payload_at: np.ndarray, records: np.ndarray,
           family: str, into: np.ndarray | None = None) -> np.ndarray:
    """The records of the chunks at ``payload_at`` (absolute offsets; ``records`` each)
    of ``data`` (the file's bytes from ``base``), as one structured array (``into``,
    where given: an array of the family's dtype and of their number): every record's
    bytes copied by fancy indexes over a strided view, no per-chunk Python. A record
    whose ``record_length`` is not the size this reader knows is
    :class:`ProfileFormatError` naming its byte."""
    dtype = FAMILY_DTYPES[family]
    size = dtype.itemsize
    offsets = _record_offsets(payload_at - base, records, size)
    if into is None:
        found = items_at(data, offsets, size).view(dtype)
    else:
        found, raw = into, into.view(np.dtype((np.void, size)))
        for at in range(0, len(offsets), GATHER_PIECE):
            raw[at:at + GATHER_PIECE] = items_at(data, offsets[at:at + GATHER_PIECE], size)
    wrong = np.flatnonzero(found["record_length"] != size)
    if len(wrong):
        row = int(wrong[0])
        raise ProfileFormatError(
            f"{path}: the {family} record at byte {base + int(offsets[row])} has record_length "
            f"{int(found['record_length'][row])}, not the {size} bytes this reader knows")
    return found


def gather_field(data: bytes | np.ndarray | mmap.mmap, base: int, payload_at: np.ndarray, records: np.ndarray, family: str,
                 name: str) -> np.ndarray:
    """One field of every record of the chunks at ``payload_at`` (as :func:`gather`, the
    field's bytes only)."""
    dtype = FAMILY_DTYPES[family]
    kind, at = dtype.fields[name]  # type: ignore[index]
    if not int(records.sum()):
        return np.zeros(0, kind)
    offsets = _record_offsets(payload_at - base, records, dtype.itemsize) + at
    return items_at(data, offsets, kind.itemsize).view(kind)


@dataclass(frozen=True)
class BlockRecords:
    """The whole records of a block, walked and checked (:func:`walk_block`)."""

    starts: np.ndarray  # int64, each record's offset in the block, in file order
    heads: np.ndarray  # their headers (:data:`HEADER_DTYPE`)
    codes: np.ndarray  # int64, each chunk's content code (a family's, or the metadata codes); -1 not a chunk
    walked: int  # where the walk stopped in the block: the next record starts there

    def payload_at(self, base: int, rows: np.ndarray) -> np.ndarray:
        """The absolute offset of the payload of the records ``rows`` (the block at ``base``)."""
        # Field by field: indexing the structured headers would copy them field by field, all of them.
        length, payload = self.heads["length"][rows].astype(np.int64), self.heads["payload_length"][rows].astype(np.int64)
        return base + self.starts[rows] + length - payload

    def content(self, block: bytes | np.ndarray | mmap.mmap, row: int) -> str:
        """The content type of record ``row`` (after :data:`CONTENT_PREFIX`)."""
        at = int(self.starts[row]) + int(self.heads["header_length"][row])
        text = bytes(block[at:at + int(self.heads["type_length"][row])])
        return text.decode("ascii", "replace").removeprefix(CONTENT_PREFIX)


def walk_block(path: Path, block: bytes | np.ndarray | mmap.mmap, base: int, end: int, position: int = 0, *,
               following: bool = False) -> BlockRecords:
    """The whole records of ``block`` (the file from byte ``base``; its records end by
    ``end``) from ``position``, their headers read and checked all at once. The walk
    reads one length per record, or leaps (:func:`_leap`). ``following``: a record not
    whole within ``end`` ends the walk unchecked (it is being written), where it is
    otherwise a damaged file (:class:`ProfileFormatError` naming its byte)."""
    size = len(block)
    limit = min(size, end - base)  # a record must end within both
    starts: list[int] = []
    leaps: list[np.ndarray] = []
    lengths: list[int] = []
    append, unpack = starts.append, _LENGTH.unpack_from
    while position + HEADER_BYTES <= size:
        leap = _leap(block, position, limit, lengths)
        if leap is not None:
            leaps.append(np.array(starts, np.int64))
            leaps.append(leap[0])
            starts.clear()
            position = leap[1]
            lengths = lengths[-16:]
            if position + HEADER_BYTES > size:
                break
        (length,) = unpack(block, position)
        if length < HEADER_BYTES or base + position + length > end or (not starts and not leaps and
                                                                       position + length > size):
            if not starts and not leaps and not following:  # the first record of a block is checked alone
                _checked_headers(path, block, base, end, np.array([position], np.int64))
            break  # checked below with the others, or the next block starts here
        if position + length > size:
            break
        append(position)
        lengths.append(length)
        position += length
    walked = np.concatenate([*leaps, np.array(starts, np.int64)]) if leaps else np.array(starts, np.int64)
    if not len(walked):
        return BlockRecords(walked, np.zeros(0, HEADER_DTYPE), np.zeros(0, np.int64), position)
    heads, codes = _checked_headers(path, block, base, end, walked)
    return BlockRecords(walked, heads, codes, position)


def _checked_headers(path: Path, block: bytes | np.ndarray | mmap.mmap, base: int, end: int,
                     walked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The record headers at ``walked`` (offsets in ``block``), checked, and the
    content code of each chunk; a record type or chunk content type the format does not
    define is :class:`ProfileFormatError`."""
    raw = np.frombuffer(block, np.uint8)
    heads = items_at(block, walked, HEADER_BYTES).view(HEADER_DTYPE)
    # Lengths past the file are refused as stored (unsigned): one of 2^63 or more turns
    # negative in int64 and would pass the sums below (a payload "of -104 bytes").
    past_the_file = (heads["length"] > np.uint64(end)) | (heads["payload_length"] > np.uint64(end))
    length = heads["length"].astype(np.int64)
    header_length = heads["header_length"].astype(np.int64)
    needed = header_length + heads["type_length"] + heads["name_length"] + heads["payload_length"].astype(np.int64)
    bad = np.flatnonzero(past_the_file | (header_length < HEADER_BYTES) | (length < needed)
                         | (base + walked + length > end) | (walked + np.maximum(needed, HEADER_BYTES) > len(raw)))
    if len(bad):
        row = int(bad[0])
        raise ProfileFormatError(
            f"{path}: the record at byte {base + int(walked[row])} has length {int(heads['length'][row])}, which "
            f"does not hold its header, content type and {int(heads['payload_length'][row])}-byte payload "
            f"within the file ({end} bytes)")
    codes = np.full(len(walked), -1, np.int64)
    chunk = heads["record_type"] == RECORD_TYPE_CHUNK
    type_at = walked + header_length
    type_length = np.where(chunk, heads["type_length"], 0)
    for length_value in np.unique(type_length).tolist():  # the few lengths present
        types = _CONTENT_BY_LENGTH.get(length_value)
        if types is None:
            continue
        mine = np.flatnonzero(type_length == length_value)
        text = items_at(raw, type_at[mine], length_value).view(np.uint8).reshape(len(mine), length_value)
        types.codes(text, mine, codes)
    strange = np.flatnonzero(~np.isin(heads["record_type"], _RECORD_TYPE_VALUES) | (chunk & (codes < 0)))
    if len(strange):  # raises: a record type or chunk content type the format does not define
        row = int(strange[0])
        at, content_length = int(type_at[row]), int(heads["type_length"][row])
        content = bytes(raw[at:at + content_length]).decode("ascii", "replace")
        check_record_kind(path, base + int(walked[row]), int(heads["record_type"][row]),
                          content.removeprefix(CONTENT_PREFIX))
    event = (codes >= 0) & (codes < len(FAMILIES))
    sizes = ITEM_SIZES[np.maximum(codes, 0)]
    uneven = np.flatnonzero(event & (heads["payload_length"].astype(np.int64) % sizes != 0))
    if len(uneven):
        row = int(uneven[0])
        raise ProfileFormatError(
            f"{path}: the {FAMILIES[int(codes[row])]} chunk at byte {base + int(walked[row])} holds "
            f"{int(heads['payload_length'][row])} bytes, not a whole number of {int(sizes[row])}-byte records")
    return heads, codes


def _leap(block: bytes | np.ndarray | mmap.mmap, position: int, limit: int,
          lengths: list[int]) -> tuple[np.ndarray, int] | None:
    """(record starts, the position after them) from ``position``, predicted by repeating
    the period of the last record ``lengths`` (a flush writes the same chunks each
    invocation) and kept up to the first record whose stored length differs: each kept
    start is the previous one plus that record's own length, so it is a record start, as
    the one-by-one walk would find it. ``None``: no period, or nothing predicted right."""
    if len(lengths) < 4:
        return None
    for period in range(1, min(8, len(lengths) // 2) + 1):
        if lengths[-period:] == lengths[-2 * period:-period]:
            break
    else:
        return None
    pattern = np.array(lengths[-period:], np.int64)
    repeats = max(1, min(LEAP_RECORDS // period, (limit - position) // int(pattern.sum())))
    steps = np.tile(pattern, repeats)
    ends = position + np.cumsum(steps)
    at = ends - steps
    fits = np.flatnonzero(ends > limit)
    count = int(fits[0]) if len(fits) else len(at)
    if not count:
        return None
    stored = items_at(block, at[:count], 8).view("<u8")
    wrong = np.flatnonzero(stored != steps[:count].astype(np.uint64))
    count = int(wrong[0]) if len(wrong) else count
    if not count:
        return None
    lengths.extend(steps[max(0, count - 16):count].tolist())
    return at[:count], int(ends[count - 1])


class ProfileFileReader:
    """``ProfileFileReader(path).read()``: the :class:`ProfileTables` of ``path``."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def version(self) -> tuple[int, int]:
        """The file-format version in the header (:class:`ProfileFormatError` if not a profile)."""
        with open(self.path, "rb") as handle:
            head = handle.read(_FILE_HEADER.size)
        if len(head) < _FILE_HEADER.size or head[:4] != MAGIC:
            raise ProfileFormatError(f"{self.path}: not an IREE HAL profile bundle (no {MAGIC.decode()} header at "
                                     f"byte 0)")
        _, major, minor, _, _, _ = _FILE_HEADER.unpack(head)
        return major, minor

    def read(self) -> ProfileTables:
        version = self.version()
        if version not in KNOWN_VERSIONS:
            known = ", ".join(f"{a}.{b}" for a, b in sorted(KNOWN_VERSIONS))
            raise ProfileFormatVersionError(
                f"{self.path}: HAL profile format {version[0]}.{version[1]}; this reader knows {known} "
                f"({PINNED_RUNTIME[0]}=={PINNED_RUNTIME[1]})")
        with open(self.path, "rb") as handle:
            return self._read(handle.fileno(), version)

    def _read(self, fd: int, version: tuple[int, int]) -> ProfileTables:
        """Every block of the file read once (the next while this one is walked), its
        records walked in bulk and each family's gathered from it (no Python per chunk:
        1M records in 0.10 s where a ``struct`` unpack per chunk took 0.39–0.48)."""
        tables = ProfileTables(self.path, version)
        _, _, _, offset, _, logical_end = _FILE_HEADER.unpack(os.pread(fd, _FILE_HEADER.size, 0))
        end = file_end(self.path, logical_end, os.fstat(fd).st_size)
        offset = first_record(self.path, offset, end)
        found = _FamilyColumns(end - offset)
        with BlockReader(ahead=True) as reader:
            for block, base, walked in walked_blocks(self.path, fd, offset, end, reader):
                self._take(block, base, walked, found, tables)
        found.into(tables)
        return tables

    def _take(self, block: np.ndarray, base: int, walked: BlockRecords, found: _FamilyColumns,
              tables: ProfileTables) -> None:
        """What a walked block holds: its event records (copied out of the buffer), the
        export names and the dropped-record counts."""
        codes, heads = walked.codes, walked.heads
        block_metadata(self.path, block, base, walked, tables.functions, tables.dropped)
        event = np.flatnonzero((codes >= 0) & (codes < len(FAMILIES)))
        if not len(event):
            return
        family, payload_at = codes[event], walked.payload_at(base, event)
        records = heads["payload_length"][event].astype(np.int64) // ITEM_SIZES[family]
        first_rows = np.unique(family, return_index=True)[1]
        for code in family[np.sort(first_rows)].tolist():  # in the order the file first has them
            mine = family == code
            found.add(self.path, block, base, FAMILIES[code], payload_at[mine], records[mine],
                      heads["stream_id"][event][mine], heads["device"][event][mine])


def block_metadata(path: Path, block: np.ndarray, base: int, walked: BlockRecords,
                   functions: dict[tuple[int, int], str], dropped: dict[str, int]) -> None:
    """What a walked block's metadata says: the export names of its executable-function
    chunks, into ``functions``, and the records its truncated chunks dropped, by family,
    into ``dropped``."""
    codes, heads = walked.codes, walked.heads
    for row in np.flatnonzero(((heads["flags"] & CHUNK_FLAG_TRUNCATED) != 0) & (codes >= 0)).tolist():
        family = walked.content(block, row)
        dropped[family] = dropped.get(family, 0) + int(heads["dropped"][row])
    for row in np.flatnonzero(codes == FUNCTIONS_CODE).tolist():
        at = int(walked.payload_at(base, np.array([row]))[0]) - base
        _functions(path, block, at, int(heads["payload_length"][row]), functions, base)


def _functions(path: Path, data: Any, at: int, length: int, functions: dict[tuple[int, int], str], base: int) -> None:
    """The export names of the executable-function records of ``length`` bytes at ``at``
    in ``data`` (the file from byte ``base``)."""
    end = at + length
    while at < end:
        if at + _FUNCTION_RECORD.size > end:
            raise ProfileFormatError(f"{path}: an executable-function record at byte {base + at} runs past its "
                                     f"chunk (byte {base + end})")
        record_length, _flags, executable, ordinal, *_rest, name_length, _h0, _h1 = \
            _FUNCTION_RECORD.unpack_from(data, at)
        if record_length < _FUNCTION_RECORD.size + name_length or at + record_length > end:
            raise ProfileFormatError(f"{path}: the executable-function record at byte {base + at} has length "
                                     f"{record_length}, which does not hold its {name_length}-byte name")
        start = at + _FUNCTION_RECORD.size
        functions[executable, ordinal] = bytes(data[start:start + name_length]).decode("utf-8", "replace")
        at += record_length


class _FamilyColumns:
    """Each family's records and per-chunk facts as a reader finds them, a block at a
    time. The records go straight into one array per family, allocated at the most the
    rest of the file could hold (address space only: pages are touched as they are
    filled) and shrunk in place to what was found (``realloc``: no copy). Joining
    per-block parts instead copied every record twice into fresh memory, whose page
    faults cost more than the whole walk (0.13 s of 0.34 for 1M records)."""

    def __init__(self, room: int) -> None:
        self.room = room  # bytes from the first record to the file's end
        self.records: dict[str, np.ndarray] = {}
        self.filled: dict[str, int] = {}
        self.counts: dict[str, list[np.ndarray]] = {}
        self.streams: dict[str, list[np.ndarray]] = {}
        self.devices: dict[str, list[np.ndarray]] = {}

    def add(self, path: Path, block: np.ndarray, base: int, family: str, payload_at: np.ndarray, counts: np.ndarray,
            streams: np.ndarray, devices: np.ndarray) -> None:
        """The chunks at ``payload_at`` of ``block`` (the file from ``base``): their records
        gathered into the family's array, their counts, streams and devices kept."""
        if family not in self.records:
            self.records[family] = np.empty(self.room // FAMILY_SIZES[family], FAMILY_DTYPES[family])
            self.filled[family] = 0
        at, total = self.filled[family], int(counts.sum())
        gather(path, block, base, payload_at, counts, family, into=self.records[family][at:at + total])
        self.filled[family] = at + total
        for kept, value in ((self.counts, counts), (self.streams, streams), (self.devices, devices)):
            kept.setdefault(family, []).append(value)

    def into(self, tables: ProfileTables) -> None:
        for family, records in self.records.items():
            records.resize(self.filled[family], refcheck=False)  # nothing else refers to it
            tables.records[family] = records
            counts = np.concatenate(self.counts[family])
            tables.chunk_starts[family] = (np.cumsum(counts) - counts).astype(np.int64)
            tables.chunk_streams[family] = np.concatenate(self.streams[family]).astype(np.int64)
            tables.chunk_devices[family] = np.concatenate(self.devices[family]).astype(np.int64)


def names(values: np.ndarray, table: tuple[str, ...]) -> np.ndarray:
    """``table[value]`` for each value (``"unknown"`` past the table, as ``iree-profile``)."""
    lookup = np.array([*table, "unknown"], dtype=object)
    return lookup[np.minimum(values.astype(np.int64), len(table))]


def read_profile(path: Path) -> ProfileTables:
    """:meth:`ProfileFileReader.read` of ``path``."""
    return ProfileFileReader(path).read()


def file_end(path: Path, logical_end: int, size: int) -> int:
    """Where the records of a profile of ``size`` bytes end: its header's logical length
    (0 while a writer has not finished it: the file's end). A length past the file is a
    truncated file; one short of it, a damaged header or bytes appended after the profile
    (IREE's writer makes the two equal), which the walk would otherwise ignore or misname
    as a truncation."""
    end = logical_end or size
    if end > size:
        raise ProfileFormatError(f"{path}: the header says {end} bytes, the file has {size} (truncated at byte {size})")
    if end < size:
        raise ProfileFormatError(f"{path}: the header at byte 16 says {end} bytes, the file has {size}: a damaged "
                                 f"header, or {size - end} bytes after the profile's end")
    return end


def first_record(path: Path, offset: int, end: int | None = None) -> int:
    """``offset``, where the file header (byte 8) says the records start, checked: past
    the header and, where ``end`` (the records' end) is known, not past it (a damaged
    header would otherwise read as a profile of no records)."""
    if offset < _FILE_HEADER.size or (end is not None and offset > end):
        where = f"inside the {_FILE_HEADER.size}-byte header" if offset < _FILE_HEADER.size else \
            f"past the file's end ({end} bytes)"
        raise ProfileFormatError(f"{path}: the header at byte 8 says the records start at byte {offset}, {where}: "
                                 f"a damaged header")
    return offset


def supported(path: Path) -> bool:
    """Whether this reader reads ``path`` (its format version is known and the runtime is
    the pinned one); ``False`` sends the caller to ``iree-profile``."""
    from dfit_mlir.core.toolchain import installed_version

    if installed_version(PINNED_RUNTIME[0]) != PINNED_RUNTIME[1]:
        return False
    return ProfileFileReader(path).version() in KNOWN_VERSIONS  # a damaged file raises


@dataclass(frozen=True)
class Records:
    """Records of one family as columns (numpy arrays of equal length, named as
    ``iree-profile``'s JSON fields); indexing or iterating gives each row as the dict
    ``iree-profile`` prints (tests, error messages), never on the run's path."""

    columns: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def __getitem__(self, row: int) -> dict[str, Any]:
        return {name: values[row].item() if hasattr(values[row], "item") else values[row]
                for name, values in self.columns.items()}

    def __iter__(self) -> Any:
        return (self[row] for row in range(len(self)))

    def __bool__(self) -> bool:
        return len(self) > 0

    def column(self, name: str, missing: Any = 0) -> np.ndarray:
        found = self.columns.get(name)
        return found if found is not None else np.full(len(self), missing)

    def where(self, mask: np.ndarray) -> Records:
        return Records({name: values[mask] for name, values in self.columns.items()})

    @classmethod
    def from_dicts(cls, records: Any) -> Records:
        """The columns of ``records`` (dicts as ``iree-profile`` prints them): the
        fallback's records in the direct reader's form. A field some records lack is
        ``0`` there (``None`` for strings)."""
        rows = list(records)
        fields = list(dict.fromkeys(name for row in rows for name in row if not isinstance(row[name], list)))
        columns = {}
        for name in fields:
            values = [row.get(name) for row in rows]
            if all(isinstance(v, (bool, int)) or v is None for v in values) and \
                    not all(isinstance(v, bool) for v in values if v is not None):
                columns[name] = np.array([0 if v is None else v for v in values], dtype=np.int64) \
                    if max((v for v in values if v is not None), default=0) < 1 << 63 \
                    else np.array([0 if v is None else v for v in values], dtype=np.uint64)
            else:
                columns[name] = np.array(values, dtype=object)
        return cls(columns)


#: The record's ``type`` as stored (its name is ``op`` / ``event_type``): what a run codes
#: event names by (sorting a few integers, not a string per record). Not iree-profile's.
TYPE_VALUE = "type_value"


def _plain(records: np.ndarray, *names: str, only: Collection[str] | None = None) -> dict[str, np.ndarray]:
    """Copies of ``names`` (ids as int64, as the JSON prints them); ``only``: of those
    among them (a caller that reads a few fields does not pay for the others)."""
    return {name: records[name].astype(np.int64) for name in names if only is None or name in only}


def queue_records(tables: ProfileTables, only: Collection[str] | None = None) -> Records:
    """``iree-profile queue``'s ``queue_event`` records (``only``: those fields of them)."""
    r = tables.family("queue-events")
    return Records({
        "event_id": r["event_id"].astype(np.int64), "op": names(r["type"], QUEUE_OPS), TYPE_VALUE: r["type"],
        **_plain(r, "flags", only=only),
        "dependency_strategy": names(r["dependency_strategy"], DEPENDENCY_STRATEGIES),
        **_plain(r, "submission_id", "command_buffer_id", "allocation_id", "physical_device_ordinal",
                 "queue_ordinal", "stream_id", "host_time_ns", "ready_host_time_ns", "wait_count", "signal_count",
                 "barrier_count", "operation_count", "payload_length", only=only)})


def host_execution_records(tables: ProfileTables, dispatches: bool = False,
                           only: Collection[str] | None = None) -> Records:
    """``iree-profile queue``'s ``host_execution_event`` records: those that are not
    dispatches (``dispatches=False``: the host operations) or all (``only``: those fields)."""
    r = tables.family("host-execution-events")
    if not dispatches:
        r = r[r["type"] != DISPATCH_TYPE]
    start, end = r["start_host_time_ns"], r["end_host_time_ns"]
    return Records({
        "event_id": r["event_id"].astype(np.int64), "op": names(r["type"], QUEUE_OPS), TYPE_VALUE: r["type"],
        **_plain(r, "flags", "status_code", "submission_id", "command_buffer_id", "command_index",
                 "executable_id", "function_ordinal", "allocation_id", "physical_device_ordinal", "queue_ordinal",
                 "stream_id", "operation_count", "payload_length", "tile_count", "tile_duration_sum_ns",
                 "start_host_time_ns", "end_host_time_ns", only=only),
        "duration_ns": end - start, "valid": (start >= 0) & (end >= start)})


def memory_records(tables: ProfileTables, only: Collection[str] | None = None) -> Records:
    """``iree-profile memory``'s ``memory_event`` records (``only``: those fields of them)."""
    r = tables.family("memory-events")
    return Records({
        "event_id": r["event_id"].astype(np.int64), "event_type": names(r["type"], MEMORY_EVENT_TYPES),
        TYPE_VALUE: r["type"],
        "event_type_value": r["type"].astype(np.int64),
        **_plain(r, "flags", "result", "host_time_ns", "allocation_id", "pool_id", "backing_id", "submission_id",
                 "physical_device_ordinal", "queue_ordinal", "frontier_entry_count", "memory_type",
                 "buffer_usage", "offset", "length", "alignment", "pool_bytes_reserved", "pool_bytes_free",
                 "pool_bytes_committed", "pool_budget_limit", "pool_reservation_count", "pool_slab_count",
                 only=only),
        "externally_owned": (r["flags"] & 32) != 0, "pool_stats_available": (r["flags"] & 16) != 0})


def queue_device_records(tables: ProfileTables) -> Records:
    """``iree-profile queue``'s ``queue_device_event`` records (device ticks, unplaced)."""
    r = tables.family("queue-device-events")
    return Records({
        "event_id": r["event_id"].astype(np.int64), "op": names(r["type"], QUEUE_OPS),
        **_plain(r, "flags", "submission_id", "command_buffer_id", "allocation_id", "stream_id", "payload_length",
                 "physical_device_ordinal", "queue_ordinal", "operation_count", "start_tick", "end_tick"),
        "valid": (r["start_tick"] != 0) & (r["end_tick"] != 0) & (r["end_tick"] >= r["start_tick"])})


def clock_samples(tables: ProfileTables) -> dict[int, list[tuple[int, int, int]]]:
    """Per physical device, (device tick, host midpoint ns, host bracket ns) of every
    clock-correlation record with a device tick and a host bracket."""
    r = tables.family("clock-correlations")
    usable = r[((r["flags"] & CLOCK_DEVICE_TICK) != 0) & ((r["flags"] & CLOCK_HOST_BRACKET) != 0)]
    samples: dict[int, list[tuple[int, int, int]]] = {}
    for device, tick, begin, end in zip(usable["physical_device_ordinal"].tolist(), usable["device_tick"].tolist(),
                                        usable["host_time_begin_ns"].tolist(), usable["host_time_end_ns"].tolist(),
                                        strict=True):
        samples.setdefault(device, []).append((tick, (begin + end) // 2, end - begin))
    return samples
