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

:class:`ProfileFileReader` reads the file through ``mmap``: the record headers are
walked once (one ``struct`` unpack per chunk, a few per invocation), each family's
payloads are gathered into one buffer and viewed with a numpy structured dtype
(:data:`FAMILY_DTYPES`). What :mod:`hal_profile` made of ``iree-profile``'s JSON lines
is rebuilt from those columns (:class:`ProfileTables`); ``iree-profile`` stays the
reference in the tests (``tests/test_profile_file.py``: field by field on real
profiles).

Only the format version this reader was written against (:data:`KNOWN_VERSIONS`, the
version IREE 3.13 writes) is read; any other is :class:`ProfileFormatVersionError`, and
the caller falls back to ``iree-profile``. A damaged file (wrong magic, a record that
runs past the end, a family record of the wrong size) is :class:`ProfileFormatError`
naming the file and the byte offset.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Collection
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
        with open(self.path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return self._read(data, version)

    def _read(self, data: mmap.mmap, version: tuple[int, int]) -> ProfileTables:
        tables = ProfileTables(self.path, version)
        _, _, _, offset, _, logical_end = _FILE_HEADER.unpack_from(data, 0)
        end = file_end(self.path, logical_end, len(data))
        spans: dict[str, list[tuple[int, int]]] = {}
        streams: dict[str, list[int]] = {}
        devices: dict[str, list[int]] = {}
        view = memoryview(data)
        try:
            while offset < end:
                if offset + _RECORD_HEADER.size > end:
                    raise ProfileFormatError(f"{self.path}: a record header at byte {offset} runs past the end "
                                             f"({end}): the file is truncated")
                (length, payload_length, _session, stream_id, _event, _executable, _buffer, header_length,
                 type_length, name_length, device, _queue, flags, dropped, _status, record_type,
                 _) = _RECORD_HEADER.unpack_from(data, offset)
                if header_length < _RECORD_HEADER.size or \
                        length < header_length + type_length + name_length + payload_length or offset + length > end:
                    raise ProfileFormatError(
                        f"{self.path}: the record at byte {offset} has length {length}, which does not hold its "
                        f"header, content type and {payload_length}-byte payload within the file ({end} bytes)")
                at = offset + header_length
                content_type = bytes(view[at:at + type_length]).decode("ascii", "replace")
                family = content_type.removeprefix(CONTENT_PREFIX)
                payload_at = offset + length - payload_length
                check_record_kind(self.path, offset, record_type, family)
                if record_type == RECORD_TYPE_CHUNK:
                    if flags & CHUNK_FLAG_TRUNCATED:
                        tables.dropped[family] = tables.dropped.get(family, 0) + dropped
                    if family in FAMILY_DTYPES:
                        size = FAMILY_SIZES[family]
                        if payload_length % size:
                            raise ProfileFormatError(
                                f"{self.path}: the {family} chunk at byte {offset} holds {payload_length} bytes, "
                                f"not a whole number of {size}-byte records")
                        spans.setdefault(family, []).append((payload_at, payload_length))
                        streams.setdefault(family, []).append(stream_id)
                        devices.setdefault(family, []).append(device)
                    elif family == "executable-functions":
                        self._functions(data, payload_at, payload_length, tables.functions)
                offset += length
            for family, found in spans.items():
                self._gather(view, family, found, streams[family], tables)
                tables.chunk_devices[family] = np.array(devices[family], dtype=np.int64)
        finally:
            view.release()
        return tables

    def _gather(self, view: memoryview, family: str, spans: list[tuple[int, int]], streams: list[int],
                tables: ProfileTables) -> None:
        dtype = FAMILY_DTYPES[family]
        joined = b"".join(view[at:at + length] for at, length in spans)
        records = np.frombuffer(joined, dtype)
        wrong = np.flatnonzero(records["record_length"] != dtype.itemsize)
        if len(wrong):
            row = int(wrong[0])
            lengths = np.array([length for _, length in spans], dtype=np.int64) // dtype.itemsize
            chunk = int(np.searchsorted(np.cumsum(lengths), row, side="right"))
            at = spans[chunk][0] + (row - int(lengths[:chunk].sum())) * dtype.itemsize
            raise ProfileFormatError(
                f"{self.path}: the {family} record at byte {at} has record_length "
                f"{int(records['record_length'][row])}, not the {dtype.itemsize} bytes this reader knows")
        counts = np.array([length // dtype.itemsize for _, length in spans], dtype=np.int64)
        tables.records[family] = records
        tables.chunk_starts[family] = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        tables.chunk_streams[family] = np.array(streams, dtype=np.int64)

    def _functions(self, data: Any, at: int, length: int, functions: dict[tuple[int, int], str]) -> None:
        end = at + length
        while at < end:
            if at + _FUNCTION_RECORD.size > end:
                raise ProfileFormatError(f"{self.path}: an executable-function record at byte {at} runs past its "
                                         f"chunk (byte {end})")
            record_length, _flags, executable, ordinal, *_rest, name_length, _h0, _h1 = \
                _FUNCTION_RECORD.unpack_from(data, at)
            if record_length < _FUNCTION_RECORD.size + name_length or at + record_length > end:
                raise ProfileFormatError(f"{self.path}: the executable-function record at byte {at} has length "
                                         f"{record_length}, which does not hold its {name_length}-byte name")
            start = at + _FUNCTION_RECORD.size
            functions[executable, ordinal] = bytes(data[start:start + name_length]).decode("utf-8", "replace")
            at += record_length


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
