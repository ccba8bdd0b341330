"""Trace exporters for a run bundle: Perfetto's native protobuf format (the ``perfetto``
package's TracePacket protos, streamed) and Chrome trace JSON. Both open in the
Perfetto UI.

Tracks: under one process-like track per stage, one track per invocation carrying
``program`` / ``function`` / ``dispatch`` slices (they nest: a function runs inside its
program, dispatches inside both) and ``tensor`` instants; runtime records that belong
to no invocation's model code (``queue`` submissions and host operations, ``memory``
events) get a track per operation. Slices are named ``<op> <root id>`` (dispatches) or
by function / operation, with export, site, fused IDs, source location, stage, MACs
and tensor statistics in their args.

Both writers stream: they read ``events.parquet`` batch by batch and write as they go,
so memory stays bounded however long the run (only the track table and a bounded cache
of serialized slice descriptions are kept). The Perfetto writer encodes the protobuf
wire format column-wise (:class:`PerfettoWriter`), not one message object per event.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dfit_mlir.core import event_schema as es
from dfit_mlir.core import locations
from dfit_mlir.core.ids import op_name_of

#: Perfetto's built-in monotonic clock (BUILTIN_CLOCK_MONOTONIC): the HAL host times.
CLOCK_MONOTONIC = 3
_SEQUENCE_ID = 0xDF17
#: Kinds drawn on an invocation's track; the others get a track per operation.
INVOCATION_KINDS = frozenset({"program", "function", "dispatch", "tensor"})
_TENSOR_ARGS = (es.TENSOR_MIN, es.TENSOR_MAX, es.TENSOR_MEAN, es.TENSOR_STD, es.TENSOR_NANS, es.TENSOR_INFS)


#: Event fields the traces read; all but the per-event ones (invocation, start,
#: duration) describe a slice, and runs repeat the same description many times.
_PER_EVENT = (es.INVOCATION, es.START_NS, es.DURATION_NS)
_DESCRIBING = (es.KIND, es.STAGE, es.SITE, es.ROOT_ID, es.PARTITION, es.MACS, es.BYTES, es.NAME, *_TENSOR_ARGS)
#: Per-event text (a queue submission's or an allocation's own numbers, as JSON): it is
#: not part of a slice's description, or every such event would have its own; the
#: writers add it to the event's args column-wise, uninterned.
_PER_EVENT_ARGS = (es.ATTRIBUTES,)
#: Slice descriptions kept for reuse (distinct ones: call sites, operations).
_DESCRIPTION_CACHE = 100_000


def track_name(kind: str, invocation: int | None, partition: str | None, name: str | None) -> str:
    """The track an event is drawn on, within its stage: its invocation's, else its operation's."""
    if kind in INVOCATION_KINDS and invocation is not None:
        return f"invocation {invocation}"
    return f"{kind}: {partition or name or kind}"


#: The page a slice's ``view`` arg names (``dfit view``'s usual ``-o view.html``; dfit
#: writes no output inside the bundle it reads). Perfetto's UI shows an arg as a link only
#: when its value starts with ``http://`` or ``https://`` (its args panel), so the arg is
#: text to paste into the page's search box, or its fragment after the page's address.
VIEW_PAGE = "view.html"


def view_link(op_id: str, page: str = VIEW_PAGE) -> str:
    """``view.html#op=main%2Flinalg.matmul%230``: the page with ``op_id`` selected (the
    fragment the page reads, the ID percent-encoded as ``encodeURIComponent`` does)."""
    from urllib.parse import quote

    return page + "#op=" + quote(op_id, safe="-_.!~*'()")


class _SliceNamer:
    """Event → slice name and args, with the per-site and per-op lookups built once (the
    writers memoise descriptions themselves)."""

    def __init__(self, manifest: dict[str, Any]):
        self.operators = {op["id"]: op for op in manifest.get("operators", [])}
        self.sites = manifest.get("partitions", {}).get("dispatch_sites", [])
        # The frontends package is heavy and traces are written late: imported here.
        from dfit_mlir.frontends import CodeRules

        self.rules = CodeRules.default()

    def name(self, event: dict[str, Any]) -> str:
        """``h.0.mlp.c_fc torch.aten.addmm`` (module path + op) where the frontend gave
        a module path, else ``linalg.matmul main/linalg.matmul#3`` (op + stable ID)."""
        root = event[es.ROOT_ID]
        if root:
            op = self.operators.get(root) or {}
            path = op.get("module_path")
            if path is not None:
                return f"{path or '(root)'} {op.get('source_op') or op.get('op') or op_name_of(root)}"
            return f"{op_name_of(root) or event[es.KIND]} {root}"
        label = event[es.PARTITION] or event.get(es.NAME)
        return f"{event[es.KIND]} {label}" if label else event[es.KIND]

    def args(self, event: dict[str, Any]) -> dict[str, Any]:
        root = event[es.ROOT_ID]
        op = (self.operators.get(root) or {}) if root else {}
        source = self._model_line(op)
        site_index = event[es.SITE]
        site = self.sites[site_index] if site_index is not None and 0 <= site_index < len(self.sites) else None
        args: dict[str, Any] = {
            "kind": event[es.KIND],
            "partition": event[es.PARTITION],
            "site": site_index if site is not None else None,
            "root_id": root,
            "op_id": root,  # the stable ID a browser view links back by
            "view": view_link(root) if root else None,
            "module_path": op.get("module_path"),
            "op": op.get("op"),
            "fused_ids": ", ".join(site["fused_ids"]) if site else None,
            "fused_modules": ", ".join(dict.fromkeys(
                path for i in site["fused_ids"] if (path := (self.operators.get(i) or {}).get("module_path"))))
            if site else None,
            "source": f"{source['file']}:{source['line']}:{source['col']}" if source else None,
            "stage": event[es.STAGE],
            "macs": event[es.MACS],
            "bytes": event[es.BYTES],
            "name": event.get(es.NAME),
            **{name: event.get(name) for name in _TENSOR_ARGS},
        }
        if event.get(es.ATTRIBUTES):
            args["attributes"] = event[es.ATTRIBUTES]
        return {name: value for name, value in args.items() if value not in (None, "")}


    def _model_line(self, op: dict[str, Any]) -> dict[str, Any] | None:
        """The op's innermost model-code frame (not a framework line), else its source."""
        frames = [frame for frame in (*(op.get("call_stack") or ()), op.get("source")) if frame and frame.get("file")]
        return locations.model_frame(frames, self.rules.is_model_code) or op.get("source")


def _trace_columns(events: Any) -> list[str]:
    """The columns of ``events`` (a ``pq.ParquetFile``) the traces read."""
    return [name for name in (*_PER_EVENT, *_DESCRIBING, *_PER_EVENT_ARGS) if name in events.schema_arrow.names]


class _Interner:
    """Perfetto's incremental interning: each string (event name, category, annotation
    name, string value) travels once, in the ``interned_data`` of the first packet that
    uses it; packets refer to it by iid. A run's slices repeat a few dozen strings
    millions of times, so this is most of the file's size (337 → ~120 bytes per event)."""

    def __init__(self) -> None:
        from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import InternedData

        self.tables: dict[str, dict[str, int]] = {}
        self.pending = InternedData()

    def iid(self, table: str, text: str) -> int:
        known = self.tables.setdefault(table, {})
        found = known.get(text)
        if found is None:
            found = known[text] = len(known) + 1
            entry = getattr(self.pending, table).add()
            entry.iid = found
            if table == "debug_annotation_string_values":
                entry.str = text.encode()
            else:
                entry.name = text
        return found



def write_perfetto(parquet: Path, manifest: dict[str, Any], path: Path) -> int:
    """Write ``trace.pftrace`` from ``events.parquet``; returns the number of slices and
    instants written (events without a start time are left out and not counted)."""
    events = es.open_parquet(parquet)
    fields = _trace_columns(events)
    with path.open("wb") as file, _WriteBehind(file) as stream:
        return PerfettoWriter(manifest, stream).write_batches(
            events.iter_batches(batch_size=_BATCH_ROWS, columns=fields))


class _WriteBehind:
    """A stream whose writes go to ``file`` from a thread, so the disk takes the previous
    batch's bytes while the next batch is encoded (both release the GIL). At most
    ``depth`` writes wait; a failed write is raised by the next write or on exit."""

    def __init__(self, file: Any, depth: int = 4):
        import queue
        import threading

        self.file = file
        self.pending: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._drain, name="dfit-trace-writer", daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        while (data := self.pending.get()) is not None:
            if self.error is None:
                try:
                    self.file.write(data)
                except BaseException as error:  # raised in the encoding thread
                    self.error = error

    def write(self, data: Any) -> int:
        if self.error is not None:
            raise self.error
        self.pending.put(data)  # a memoryview keeps its Arrow buffer alive until written
        return len(data)

    def __enter__(self) -> _WriteBehind:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.pending.put(None)
        self.thread.join()
        if self.error is not None and exc[0] is None:
            raise self.error


#: Tracks of invocations (and operations) remembered: events of an invocation that come
#: back after this many others were drawn go on a second track of the same name. Keeps
#: the writer's memory bounded however many invocations a run has.
_LIVE_TRACKS = 65_536


def _forget_oldest(recent: OrderedDict[Any, Any]) -> None:
    """Keep the :data:`_LIVE_TRACKS` most recently used entries of ``recent`` (used ones
    are popped and put back, so they come last). An OrderedDict: dropping the first
    entries of a plain dict again and again makes each drop slower (its iteration skips
    the emptied slots), which showed past 65,536 invocations."""
    while len(recent) > _LIVE_TRACKS:
        recent.popitem(last=False)
#: Events encoded at a time: bounds the writer's memory (~100 bytes of output per event).
_BATCH_ROWS = 131_072
#: TracePacket / TrackEvent field tags (wire type in the low 3 bits), as Perfetto's protos number them.
_TRACE_PACKET = 0x0A  # Trace.packet = 1, length-delimited
_TIMESTAMP = 0x40  # TracePacket.timestamp = 8, varint
_INTERNED_DATA = 0x62  # TracePacket.interned_data = 12, length-delimited
_TRACK_EVENT = 0x5A  # TracePacket.track_event = 11, length-delimited
_TRACK_UUID = 0x58  # TrackEvent.track_uuid = 11, varint
_FLOW_IDS = b"\xf9\x02"  # TrackEvent.flow_ids = 47, fixed64
_SLICE_END = b"\x48\x02"  # TrackEvent.type = 9: TYPE_SLICE_END


def _varint(value: int) -> bytes:
    if value < 0x80:  # most lengths and uuids: no loop
        return _SMALL_VARINTS[value]
    if value < 0x4000:
        return bytes((value & 0x7F | 0x80, value >> 7))
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


_SMALL_VARINTS = [bytes((value,)) for value in range(0x80)]


def _varint_width(value: int) -> int:
    """Bytes ``value`` (non-negative) takes as a minimal protobuf varint."""
    return max(1, (int(value).bit_length() + 6) // 7)


def _padded_varints(out: np.ndarray, values: np.ndarray, width: int) -> None:
    """Write ``values`` into the ``width`` columns of ``out`` (rows × width bytes) as
    varints padded to ``width`` bytes: every byte but the last has its continuation bit
    set, so 5 in three bytes is ``85 80 00``. Protobuf parsers read padded varints as the
    value (Perfetto's own writer pads message lengths the same way); a fixed width per
    batch is what lets every packet's head be one row of a byte matrix."""
    rest = values.astype(np.uint64, copy=False)
    for k in range(width):
        byte = (rest >> np.uint64(7 * k)) & np.uint64(0x7F)
        out[:, k] = byte.astype(np.uint8) | (0x80 if k + 1 < width else 0)


def _data_end(array: Any) -> int:
    """Where the values of ``array`` (large_binary, unsliced) end in its data buffer."""
    assert array.offset == 0
    return int(np.frombuffer(array.buffers()[1], dtype=np.int64, count=len(array) + 1)[-1])


def _joined(*columns: Any) -> Any:
    """Arrow's row-wise concatenation of binary ``columns``. They are ``large_binary``
    (64-bit offsets), so a batch of long descriptions cannot overflow them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.binary_join_element_wise(*columns, pa.scalar(b"", pa.large_binary()))


def _fixed_rows(matrix: np.ndarray, present: np.ndarray | None = None) -> Any:
    """An Arrow binary array whose values are the rows of ``matrix`` (no copy); with
    ``present`` (a mask, one row of ``matrix`` per True), empty values where it is False."""
    import pyarrow as pa

    rows, width = matrix.shape
    if present is None:
        offsets = np.arange(rows + 1, dtype=np.int64) * width
    else:
        offsets = np.concatenate([[0], np.cumsum(present * width)]).astype(np.int64)
    return pa.Array.from_buffers(pa.large_binary(), len(offsets) - 1,
                                 [None, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(matrix))])


def _sparse_rows(count: int, values: dict[int, bytes]) -> Any:
    """An Arrow binary array of ``count`` values, empty but at the rows of ``values``."""
    import pyarrow as pa

    lengths = np.zeros(count + 1, dtype=np.int64)
    rows = sorted(values)
    lengths[np.asarray(rows, dtype=np.int64) + 1] = [len(values[row]) for row in rows]
    data = b"".join(values[row] for row in rows)
    return pa.Array.from_buffers(pa.large_binary(), count, [None, pa.py_buffer(np.cumsum(lengths)),
                                                      pa.py_buffer(data)])


def _track_descriptor(uuid: int, name: str, parent: int | None) -> bytes:
    """A TracePacket holding one TrackDescriptor (uuid = 1, name = 2, parent_uuid = 5;
    TracePacket.track_descriptor = 60)."""
    encoded = name.encode()
    descriptor = b"\x08" + _varint(uuid) + b"\x12" + _varint(len(encoded)) + encoded + \
        (b"\x28" + _varint(parent) if parent is not None else b"")
    packet = b"\xe2\x03" + _varint(len(descriptor)) + descriptor
    return bytes([_TRACE_PACKET]) + _varint(len(packet)) + packet


def _track_descriptors(tracks: list[tuple[int, str, int]]) -> bytes:
    """:func:`_track_descriptor` of many (uuid, name, parent) at once: a run has a track per
    invocation, so a batch can hold thousands of new ones. Heads are fixed-width rows
    (padded varints), the names a column joined after them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    uuids = np.fromiter((uuid for uuid, _, _ in tracks), dtype=np.int64, count=len(tracks))
    parents = np.fromiter((parent for _, _, parent in tracks), dtype=np.int64, count=len(tracks))
    names = pa.array([name for _, name, _ in tracks], pa.large_string()).cast(pa.large_binary())
    name_lengths = np.asarray(pc.binary_length(names), dtype=np.int64)
    uuid_width = _varint_width(int(max(uuids.max(), parents.max())))
    name_width = _varint_width(int(name_lengths.max()))
    descriptor = 2 * (1 + uuid_width) + 1 + name_width + name_lengths
    descriptor_width = _varint_width(int(descriptor.max()))
    packet = 2 + descriptor_width + descriptor
    packet_width = _varint_width(int(packet.max()))
    layout = [(_TRACE_PACKET, 1), (packet, packet_width), (b"\xe2\x03", 2), (descriptor, descriptor_width),
              (0x08, 1), (uuids, uuid_width), (0x28, 1), (parents, uuid_width), (0x12, 1),
              (name_lengths, name_width)]
    heads = _fixed_rows(_byte_rows(len(tracks), layout))
    return _joined(heads, names).buffers()[2].to_pybytes()


def _byte_rows(rows: int, layout: list[tuple[Any, int]]) -> np.ndarray:
    """A rows × width byte matrix laid out by ``layout``: (value, width) in order, where a
    value is constant bytes, a constant byte (int < 128, width 1), or an int or int array
    written as varints padded to ``width``."""
    matrix = np.empty((rows, sum(width for _, width in layout)), dtype=np.uint8)
    at = 0
    for value, width in layout:
        if isinstance(value, bytes):
            matrix[:, at:at + width] = np.frombuffer(value, dtype=np.uint8)
        elif isinstance(value, int) and width == 1 and value < 0x80:
            matrix[:, at] = value
        else:
            _padded_varints(matrix[:, at:at + width], np.broadcast_to(np.asarray(value), (rows,)), width)
        at += width
    return matrix


def _codes(column: Any) -> tuple[np.ndarray, list[Any]]:
    """(code per row, value per code) of an Arrow column; null is a value like any other."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if column.null_count == len(column):
        return np.zeros(len(column), dtype=np.int64), [None]
    encoded = column if pa.types.is_dictionary(column.type) else pc.dictionary_encode(column)
    values = encoded.dictionary.to_pylist() + [None]
    indices = encoded.indices.fill_null(len(values) - 1)
    return np.asarray(indices, dtype=np.int64), values


def _row_keys(codes: list[tuple[np.ndarray, list[Any]]], count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group rows by their codes: (first row of each group, group of each row, group order).
    Groups are numbered in first-use order when the codes fit one integer key (hashed by
    Arrow, no sort), else by a row-wise sort and then put in first-use order."""
    import pyarrow as pa
    import pyarrow.compute as pc

    codes = [(column, values) for column, values in codes if len(values) > 1]  # a constant tells no row apart
    radix = 1
    for _, values in codes:
        radix *= len(values)
    if radix < 2**62:
        key = np.zeros(count, dtype=np.int64)
        for column, values in codes:
            key = key * len(values) + column
        encoded = pc.dictionary_encode(pa.array(key))
        inverse = np.asarray(encoded.indices, dtype=np.int64)
        # Groups are numbered as they first appear, so a group's first row is where the
        # running maximum of the group numbers first reaches it.
        first = np.flatnonzero(np.diff(np.maximum.accumulate(inverse), prepend=-1) > 0)
        return first, inverse, np.arange(len(first))
    stacked = np.ascontiguousarray(np.stack([column for column, _ in codes], axis=1))
    _, first, inverse = np.unique(stacked, axis=0, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1), np.argsort(first, kind="stable")


class _Lanes:
    """Which lane of its track each slice goes on, so that the slices of one lane nest
    (Perfetto ends the most recent open slice of a track: crossing slices would be paired
    wrongly). Most tracks nest already and stay on lane 0, found by a vectorized check
    that also sees the slices still open at the end of the previous batch; a track with
    crossing slices is laid out slice by slice, first-fit, and keeps its lanes' open
    slices for the next batches (the most recently used :data:`_LIVE_TRACKS` tracks).

    Events are expected in time order across batches, as every bundle writes them: a
    slice starting before the previous batch's last start is checked against the slices
    still open then, not against all earlier ones."""

    def __init__(self) -> None:
        #: Laid-out track → per lane, the ends of its open slices (innermost last).
        self.open: OrderedDict[tuple[Any, ...], list[list[int]]] = OrderedDict()
        #: Nesting track → its slices (start, end, kind) still open at the last batch's
        #: last start: what a slice of the next batch could cross.
        self.carried: dict[tuple[Any, ...], list[tuple[int, int, int]]] = {}
        self.kind_numbers: dict[Any, int] = {}

    def kinds(self, codes: np.ndarray, values: list[Any]) -> np.ndarray:
        """Kind codes of one batch → kind numbers that hold across batches."""
        numbers = self.kind_numbers
        return np.array([numbers.setdefault(value, len(numbers)) for value in values], dtype=np.int64)[codes]

    def assign(self, tracks: list[tuple[Any, ...]], track_of_row: np.ndarray, kinds: np.ndarray,
               starts: np.ndarray, ends: np.ndarray, instant: np.ndarray) -> np.ndarray:
        """The lane of each row (0 for instants); ``kinds`` from :meth:`kinds`."""
        lanes = np.zeros(len(starts), dtype=np.int64)
        rows = np.flatnonzero(~instant)
        if not len(rows):
            return lanes
        # The batch's slices and the carried ones (row -1), by track, start, longest first.
        keys = list(tracks)
        index_of = {key: index for index, key in enumerate(keys)} if self.carried else {}
        carried: list[tuple[int, int, int, int]] = []
        for key, slices in self.carried.items():
            index = index_of.get(key)
            if index is None:  # a track of an earlier batch: its slices still count
                index = index_of[key] = len(keys)
                keys.append(key)
            carried += [(index, *slice_) for slice_ in slices]
        carried.sort(key=lambda slice_: slice_[1])  # they started before this batch: first, in time order
        track = np.concatenate([np.array([c[0] for c in carried], dtype=np.int64), track_of_row[rows]])
        start = np.concatenate([np.array([c[1] for c in carried], dtype=np.int64), starts[rows]])
        end = np.concatenate([np.array([c[2] for c in carried], dtype=np.int64), ends[rows]])
        kind = np.concatenate([np.array([c[3] for c in carried], dtype=np.int64), kinds[rows]])
        row = np.concatenate([np.full(len(carried), -1, dtype=np.int64), rows])
        order = _by_track_then_start(track, start)
        track, start, end, kind, row = track[order], start[order], end[order], kind[order], row[order]
        crossing = _crossing(track, kind, start, end)
        todo = {index for index, key in enumerate(keys) if key in self.open} if self.open else set()
        if crossing.any():
            todo |= set(track[crossing].tolist())
        bounds = np.searchsorted(track, [sorted(todo), np.add(sorted(todo), 1)])
        for index, begin, stop in zip(sorted(todo), bounds[0].tolist(), bounds[1].tolist(), strict=True):
            key = keys[index]
            stacks = self.open.pop(key, None)
            if stacks is None:  # its carried slices nest (they all hold one instant): lane 0's stack
                stacks = [[end for _, end, _ in sorted(self.carried.pop(key, []))]]
            # Longest first among equal starts, so that the shorter nest in it.
            for at in sorted(range(begin, stop), key=lambda at: (start[at], -end[at])):
                if row[at] >= 0:
                    lanes[row[at]] = _first_fit(stacks, int(start[at]), int(end[at]))
            self.open[key] = stacks
        _forget_oldest(self.open)
        # What the nesting tracks carry into the next batch.
        last_start = int(starts[rows].max())
        keep = end > last_start
        if todo:
            keep &= ~np.isin(track, sorted(todo))
        self.carried = {}
        for index, slice_start, slice_end, slice_kind in zip(track[keep].tolist(), start[keep].tolist(),
                                                             end[keep].tolist(), kind[keep].tolist(), strict=True):
            self.carried.setdefault(keys[index], []).append((slice_start, slice_end, slice_kind))
        return lanes


def _by_track_then_start(track: np.ndarray, start: np.ndarray) -> np.ndarray:
    """The order of rows by track, then start (one stable sort when the rows come in
    time order, as they do from every bundle)."""
    if len(start) < 2 or bool((start[1:] >= start[:-1]).all()):
        return np.argsort(track, kind="stable")
    return np.lexsort((start, track))


def _first_fit(stacks: list[list[int]], start: int, end: int) -> int:
    """The first lane where a slice [start, end) nests (its open slices that ended are
    closed first), opening a new lane if none; the slice is pushed on it."""
    for lane, stack in enumerate(stacks):
        while stack and stack[-1] <= start:
            stack.pop()
        if not stack or end <= stack[-1]:
            stack.append(end)
            return lane
    stacks.append([end])
    return len(stacks) - 1


def _crossing(track: np.ndarray, kind: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Which slices may cross another of their track (rows sorted by track, then start;
    equal starts in any order).

    Exact when each kind's slices on a track are disjoint (one invocation's program,
    functions and dispatches; one queue's operations): then two slices can only cross if
    they are of different kinds, and a slice y can only cross the slice x of another kind
    that starts last at or before it — y must end inside x, or start at or after x's end.
    Slices of one kind that overlap are flagged as they are (first-fit sorts them out)."""
    count = len(start)
    flagged = np.zeros(count, dtype=bool)
    by_kind = np.argsort(track * (int(kind.max()) + 1) + kind, kind="stable")  # start order kept
    same_group = (track[by_kind][1:] == track[by_kind][:-1]) & (kind[by_kind][1:] == kind[by_kind][:-1])
    overlap = same_group & (start[by_kind][1:] < end[by_kind][:-1])
    flagged[by_kind[1:][overlap]] = True
    flagged[by_kind[:-1][overlap]] = True
    # Position of each slice in (track, start) order: rows are sorted so already.
    for kind_x in np.unique(kind).tolist():
        xs = np.flatnonzero(kind == kind_x)
        ys = np.flatnonzero(kind != kind_x)
        if not len(ys):
            continue
        # The x of the same track starting last at or before each y: xs are in
        # (track, start) order, so a search on the rows' order finds it.
        found = np.searchsorted(xs, ys, side="right") - 1
        has = found >= 0
        x = xs[np.maximum(found, 0)]
        has &= track[x] == track[ys]
        nested = end[ys] <= end[x]
        after = start[ys] >= end[x]
        same_start = start[ys] == start[x]  # nested one way or the other: checked from x's side
        bad = has & ~nested & ~after & ~same_start
        flagged[ys[bad]] = True
        flagged[x[bad]] = True
    return flagged


@dataclass(frozen=True)
class _Grouped:
    """A batch of events (those with a start time), grouped for the trace writers: the
    few distinct tracks and slice descriptions, and which one each event has."""

    count: int
    starts: np.ndarray
    durations: np.ndarray
    #: Drawn as an instant (a tensor record, or no duration), not a slice.
    instant: np.ndarray
    #: (group, stage, track name, lane) of each distinct track.
    tracks: list[tuple[str | None, str, str, int]]
    track_of_row: np.ndarray
    #: (instant, the describing fields) of each distinct description, in first-use order.
    descriptions: list[tuple[bool, dict[str, Any]]]
    description_of_row: np.ndarray
    #: The first row with each description.
    description_rows: np.ndarray
    #: Row → flow id (merged traces: events sharing one are linked).
    flows: dict[int, int]
    #: Each event's attributes (Arrow large_binary, empty for none: no annotation).
    attributes: Any


def _group(batch: Any, lanes: _Lanes) -> _Grouped | None:
    """Group ``batch``'s events (Arrow record batch of :func:`_trace_columns`, plus the
    optional ``track_group`` and ``flow_id``); ``None`` when none has a start time.
    A track whose slices cross is split into lanes (``lanes``, the writer's own)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = batch.schema.names
    if es.START_NS not in names or not batch.num_rows:
        return None
    starts_column = batch.column(es.START_NS)
    if starts_column.null_count:
        batch = batch.filter(pc.is_valid(starts_column))
    count = batch.num_rows
    if not count:
        return None
    column = {name: batch.column(name) for name in names}

    def optional(name: str) -> Any:
        return column[name] if name in column else pa.nulls(count, pa.string())

    starts = np.asarray(column[es.START_NS], dtype=np.int64)
    durations = np.asarray(column[es.DURATION_NS].fill_null(0), dtype=np.int64) if es.DURATION_NS in column \
        else np.zeros(count, dtype=np.int64)
    kinds, kind_values = _codes(column[es.KIND])
    tensor_kind = np.array([value == "tensor" for value in kind_values])
    instant = tensor_kind[kinds] | (durations <= 0)

    # Tracks: distinct (group, stage, kind, invocation, partition, name), then their track names.
    track_columns = [_codes(optional(name)) for name in ("track_group", es.STAGE)] + [(kinds, kind_values)] + \
        [_codes(optional(name)) for name in (es.INVOCATION, es.PARTITION, es.NAME)]
    # An invocation's events share its track whatever their partition; the others, one per operation.
    (invocations, invocation_values), (partitions, partition_values), (names_, name_values) = track_columns[3:]
    on_invocation = np.array([value in INVOCATION_KINDS for value in kind_values])[kinds] & \
        (invocations != len(invocation_values) - 1)
    track_columns[3] = (np.where(on_invocation, invocations, len(invocation_values) - 1), invocation_values)
    track_columns[4] = (np.where(on_invocation, len(partition_values) - 1, partitions), partition_values)
    track_columns[5] = (np.where(on_invocation, len(name_values) - 1, names_), name_values)
    first, inverse, order = _row_keys(track_columns, count)
    rows = first[order]
    values_of = [[values[code] for code in codes[rows].tolist()] for codes, values in track_columns]
    named: dict[tuple[str | None, str, str], int] = {}
    track_of_key = np.zeros(len(first), dtype=np.int64)
    for key_index, (group, stage, kind, invocation, partition, name) in zip(
            order.tolist(), zip(*values_of, strict=True), strict=True):
        track_of_key[key_index] = named.setdefault(
            (group, stage, track_name(kind, invocation, partition, name)), len(named))
    # Slices on one track must nest; where some cross (asynchronous queue operations,
    # overlapping vendor phases), they go on lanes: tracks of the same name (Perfetto's
    # UI shows same-named siblings as one track).
    named_tracks = list(named)
    lane = lanes.assign(named_tracks, track_of_key[inverse], lanes.kinds(kinds, kind_values), starts,
                        starts + durations, instant)
    track_of_row = track_of_key[inverse]
    tracks = [(*key, 0) for key in named_tracks]
    if lane.any():
        width = int(lane.max()) + 1
        laned, track_of_row = np.unique(track_of_row * width + lane, return_inverse=True)
        tracks = [(*named_tracks[key // width], key % width) for key in laned.tolist()]

    # Descriptions: distinct (instant, describing fields), in first-use order.
    describing = [(instant.astype(np.int64), [False, True])] + \
        [_codes(column[name]) if name in column else (np.zeros(count, dtype=np.int64), [None])
         for name in _DESCRIBING]
    first, description_of_row, order = _row_keys(describing, count)
    descriptions = []
    for key_index in order.tolist():
        row = first[key_index]
        descriptions.append((bool(instant[row]), {name: describing[k + 1][1][describing[k + 1][0][row]]
                                                  for k, name in enumerate(_DESCRIBING)}))
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    flows: dict[int, int] = {}
    if "flow_id" in column and column["flow_id"].null_count < count:
        flows = {row: int(flow) for row, flow in enumerate(column["flow_id"].to_pylist()) if flow is not None}
    attributes = pa.nulls(count, pa.large_binary()) if es.ATTRIBUTES not in column \
        else column[es.ATTRIBUTES].cast(pa.large_string()).cast(pa.large_binary())
    return _Grouped(count, starts, durations, instant, tracks, np.asarray(track_of_row).reshape(-1), descriptions,
                    rank[description_of_row], first[order], flows, attributes.fill_null(b""))


class PerfettoWriter:
    """Events → ``.pftrace`` bytes, encoded a batch of events at a time.

    The wire format is plain protobuf, so packets are written column-wise: what a slice
    looks like (its name, category and arguments, interned) is built once per distinct
    description with Perfetto's own message classes; each event adds only its head (a
    fixed-width byte row: timestamp, track and the lengths around them, as padded
    varints), filled for the whole batch with numpy, and Arrow joins heads and
    descriptions row by row into the output bytes. The packets decode to the ones one
    ``TracePacket`` object per event would give (``tests/perfetto_reference.py``).

    Optional columns: ``track_group`` (a string: the host/rank a track belongs under, as
    a parent track) and ``flow_id`` (an integer: events sharing one are linked by a
    Perfetto flow, in time order).
    """

    def __init__(self, manifest: dict[str, Any], stream: Any):
        from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TracePacket, TrackEvent

        self.stream = stream
        self.namer = _SliceNamer(manifest)
        self.interner = _Interner()
        #: Track uuid by the events' track fields, and by (group, stage, track name).
        #: Uuids of the group and stage tracks (few), and of the tracks events are drawn on
        #: by (group, stage, track name): one per invocation, so the writer keeps only the
        #: most recently used :data:`_LIVE_TRACKS` of those.
        self.parents: dict[tuple[Any, ...], int] = {}
        self.tracks: OrderedDict[tuple[Any, ...], int] = OrderedDict()
        self.next_uuid = 1
        self.lanes = _Lanes()
        self.descriptions: dict[tuple[Any, ...], bytes] = {}
        self._track_event = TrackEvent
        self._trace_packet = TracePacket
        header = TracePacket()
        header.timestamp_clock_id = CLOCK_MONOTONIC
        header.trusted_packet_sequence_id = _SEQUENCE_ID
        header.sequence_flags = TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        #: The fields every event packet shares (clock, sequence, flags), serialized.
        self.common = header.SerializeToString()
        start = TracePacket()
        start.trusted_packet_sequence_id = _SEQUENCE_ID
        start.sequence_flags = TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        start.first_packet_on_sequence = True
        self._emit_packet(start)
        self.written = 0

    def _emit_packet(self, packet: Any) -> None:
        body = packet.SerializeToString()
        self.stream.write(bytes([_TRACE_PACKET]) + _varint(len(body)) + body)

    def _stage_track(self, group: str | None, stage: str, out: list[bytes]) -> int:
        """The uuid of ``stage``'s track (under ``group``'s, if any); descriptors of those
        new so far go to ``out``."""
        stage_uuid = self.parents.get((group, stage))
        if stage_uuid is None:
            parent = None if group is None else self._parent_track((group,), group, None, out)
            stage_uuid = self._parent_track((group, stage), f"stage: {stage}", parent, out)
        return stage_uuid

    def _parent_track(self, key: tuple[Any, ...], name: str, parent: int | None, out: list[bytes]) -> int:
        uuid = self.parents.get(key)
        if uuid is None:
            uuid = self.parents[key] = self._new_uuid()
            out.append(_track_descriptor(uuid, name, parent))
        return uuid

    def _new_uuid(self) -> int:
        self.next_uuid += 1
        return self.next_uuid - 1

    def _description(self, instant: bool, event: dict[str, Any]) -> tuple[bytes, bytes]:
        """(TrackEvent fields of a slice begin or instant, body of the interned data first
        used by it)."""
        key = (instant, *(event.get(field) for field in _DESCRIBING))
        found = self.descriptions.get(key)
        if found is not None:
            return found, b""
        name, args = self.namer.name(event), self.namer.args(event)
        interner = self.interner
        message = self._track_event()
        message.type = self._track_event.TYPE_INSTANT if instant else self._track_event.TYPE_SLICE_BEGIN
        message.name_iid = interner.iid("event_names", name)
        message.category_iids.append(interner.iid("event_categories", "dfit"))
        for arg, value in args.items():
            annotation = message.debug_annotations.add()
            annotation.name_iid = interner.iid("debug_annotation_names", arg)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                annotation.string_value_iid = interner.iid("debug_annotation_string_values", str(value))
            elif isinstance(value, int):
                annotation.int_value = value
            else:
                annotation.double_value = value
        fields = message.SerializeToString()
        if len(self.descriptions) < _DESCRIPTION_CACHE:
            self.descriptions[key] = fields
        return fields, self._interned_body()

    def _interned_body(self) -> bytes:
        """The InternedData fields interned since the last call (unwrapped: a packet must
        carry one ``interned_data`` field, so bodies of one packet are concatenated)."""
        pending = self.interner.pending
        if not pending.ByteSize():
            return b""
        body = pending.SerializeToString()
        pending.Clear()
        return body

    def write_batches(self, batches: Any) -> int:
        for batch in batches:
            self.write_batch(batch)
        return self.written

    def write_batch(self, batch: Any) -> None:
        grouped = _group(batch, self.lanes)
        if grouped is None:
            return
        parents: list[bytes] = []
        new_tracks: list[tuple[int, str, int]] = []  # (uuid, name, parent uuid): one per new invocation, mostly
        uuids = np.zeros(len(grouped.tracks), dtype=np.int64)
        live = self.tracks
        for index, key in enumerate(grouped.tracks):
            uuid = live.pop(key, None)  # popped and put back: the most recently used come last
            if uuid is None:
                parent = self._stage_track(key[0], key[1], parents)
                uuid = self._new_uuid()
                new_tracks.append((uuid, key[2], parent))
            live[key] = uuids[index] = uuid
        _forget_oldest(live)
        self.stream.write(b"".join(parents))
        if new_tracks:
            self.stream.write(_track_descriptors(new_tracks))

        fields_of: list[bytes] = []
        interned_at: dict[int, bytes] = {}
        for (instant, event), row in zip(grouped.descriptions, grouped.description_rows.tolist(), strict=True):
            fields, interned = self._description(instant, event)
            fields_of.append(fields)
            if interned:
                interned_at[row] = interned
        attributes = self._attribute_annotations(grouped.attributes, interned_at)
        interned_at = {row: bytes([_INTERNED_DATA]) + _varint(len(body)) + body for row, body in interned_at.items()}
        flows = {row: _FLOW_IDS + flow.to_bytes(8, "little") for row, flow in grouped.flows.items()}
        self._encode(grouped.starts, grouped.durations, grouped.instant, uuids[grouped.track_of_row],
                     grouped.description_of_row, fields_of, attributes, interned_at, flows)
        self.written += grouped.count

    def _attribute_annotations(self, attributes: Any, interned_at: dict[int, bytes]) -> list[Any]:
        """Each event's ``attributes`` debug annotation (TrackEvent.debug_annotations = 4:
        name_iid = 1, string_value = 6), column-wise: [] when no event has any, else two
        Arrow columns (fixed-width heads, the text) joined into the TrackEvent. A new
        ``attributes`` name iid goes with the first row that has one."""
        import pyarrow.compute as pc

        lengths = np.asarray(pc.binary_length(attributes), dtype=np.int64)
        present = lengths > 0
        if not present.any():
            return []
        iid = self.interner.iid("debug_annotation_names", "attributes")
        body = self._interned_body()
        if body:
            row = int(np.argmax(present))
            interned_at[row] = interned_at.get(row, b"") + body
        lengths = lengths[present]
        text_width, iid_width = _varint_width(int(lengths.max())), _varint_width(iid)
        annotation = 1 + iid_width + 1 + text_width + lengths
        annotation_width = _varint_width(int(annotation.max()))
        heads = _byte_rows(len(lengths), [(0x22, 1), (annotation, annotation_width), (0x08, 1), (iid, iid_width),
                                          (0x32, 1), (lengths, text_width)])
        return [_fixed_rows(heads, present), attributes]

    def _encode(self, starts: np.ndarray, durations: np.ndarray, instant: np.ndarray, tracks: np.ndarray,
                descriptions: np.ndarray, fields_of: list[bytes], attributes: list[Any],
                interned_at: dict[int, bytes], flows: dict[int, bytes]) -> None:
        """Every event's packets (a begin or instant packet, then an end packet unless an
        instant), laid out as columns joined row by row by Arrow:

        * head: ``[packet tag][length][timestamp tag][timestamp][shared fields]
          [TrackEvent tag][length][track_uuid tag][uuid]`` — one row of a byte matrix;
        * the description's TrackEvent fields (type, name, category, arguments), taken
          from the few distinct ones;
        * the event's own ``attributes`` annotation, if any (two columns: heads, text);
        * sparse extras: a flow id (still inside the TrackEvent, which is why it comes
          right after the fields) and interned data first used here (a TracePacket field
          after the TrackEvent; a packet's fields may come in any order);
        * the end packet (slices only): again one row of a byte matrix.

        Varints in the heads are padded to one width per batch (:func:`_padded_varints`),
        so the heads are fixed-width rows and the only per-event work is filling their
        varying columns (timestamp, uuid, lengths), a few numpy operations per column."""
        import pyarrow as pa
        import pyarrow.compute as pc

        count = len(starts)
        common = self.common
        ends = starts + durations
        timestamp_width = _varint_width(max(int(starts.max()), int(ends.max())))
        uuid_width = _varint_width(int(tracks.max()))
        fields_length = np.array([len(blob) for blob in fields_of], dtype=np.int64)[descriptions]
        flow_length = np.zeros(count, dtype=np.int64)
        interned_length = np.zeros(count, dtype=np.int64)
        for row, data in flows.items():
            flow_length[row] = len(data)
        for row, data in interned_at.items():
            interned_length[row] = len(data)
        attributes_length = sum((np.asarray(pc.binary_length(column), dtype=np.int64) for column in attributes),
                                np.zeros(count, dtype=np.int64))
        event_length = 1 + uuid_width + fields_length + attributes_length + flow_length
        end_event_length = 1 + uuid_width + len(_SLICE_END)
        event_width = _varint_width(max(int(event_length.max()), end_event_length))
        fixed = 1 + timestamp_width + len(common) + 1 + event_width  # up to the TrackEvent's contents
        packet_length = fixed + event_length + interned_length
        end_packet_length = fixed + end_event_length
        packet_width = _varint_width(max(int(packet_length.max()), end_packet_length))

        def heads(rows: int, lengths: np.ndarray | int, timestamps: np.ndarray, events: np.ndarray | int,
                  uuids: np.ndarray, tail: bytes = b"") -> np.ndarray:
            return _byte_rows(rows, [(_TRACE_PACKET, 1), (lengths, packet_width), (_TIMESTAMP, 1),
                                     (timestamps, timestamp_width), (common, len(common)), (_TRACK_EVENT, 1),
                                     (events, event_width), (_TRACK_UUID, 1), (uuids, uuid_width),
                                     (tail, len(tail))])

        columns = [_fixed_rows(heads(count, packet_length, starts, event_length, tracks)),
                   pa.array(fields_of, pa.large_binary()).take(pa.array(descriptions)), *attributes]
        if flows or interned_at:
            extras = {row: flows.get(row, b"") + interned_at.get(row, b"") for row in {*flows, *interned_at}}
            columns.append(_sparse_rows(count, extras))
        slices = ~instant
        if slices.any():
            end_rows = heads(int(slices.sum()), end_packet_length, ends[slices], end_event_length, tracks[slices],
                             _SLICE_END)
            columns.append(_fixed_rows(end_rows, slices))
        packets = _joined(*columns)
        self.stream.write(memoryview(packets.buffers()[2])[:_data_end(packets)])


def write_chrome_json(parquet: Path, manifest: dict[str, Any], path: Path) -> int:
    """Write ``trace.json`` (Chrome trace event format: complete and instant events),
    streamed from ``events.parquet``; returns the number of events written."""
    events = es.open_parquet(parquet)
    fields = _trace_columns(events)
    with path.open("wb") as file, _WriteBehind(file) as stream:
        writer = ChromeJsonWriter(manifest, stream)
        written = writer.write_batches(events.iter_batches(batch_size=_BATCH_ROWS, columns=fields))
        writer.close()
    return written


class ChromeJsonWriter:
    """Events → Chrome trace JSON text, a batch at a time, grouped like
    :class:`PerfettoWriter`'s: a process per (group and) stage, a thread per track. Each
    distinct slice description becomes its JSON text once; each event adds its thread,
    timestamp and duration, formatted for the whole batch by Arrow (exact decimal
    microseconds, so nanoseconds survive) and joined row by row."""

    def __init__(self, manifest: dict[str, Any], stream: Any):
        self.stream = stream
        self.namer = _SliceNamer(manifest)
        self.pids: dict[tuple[str | None, str], int] = {}
        #: Threads by (group, stage, track name); like the Perfetto writer's tracks, only
        #: the most recently used are kept (a forgotten one comes back as a new thread).
        self.tids: OrderedDict[tuple[str | None, str, str, int], int] = OrderedDict()
        self.next_tid = 1
        self.lanes = _Lanes()
        self.descriptions: dict[tuple[Any, ...], tuple[str, str]] = {}
        self.written = 0
        self.first = True
        stream.write(b'{"displayTimeUnit": "ns", "traceEvents": [\n')

    def _emit(self, text: str | bytes | memoryview) -> None:
        """Write records (text joined by ",\\n"; bytes already separated)."""
        if not text:
            return
        if isinstance(text, str):
            text = (text if self.first else ",\n" + text).encode()
        self.stream.write(text)
        self.first = False

    def write_batches(self, batches: Any) -> int:
        for batch in batches:
            self.write_batch(batch)
        return self.written

    def close(self) -> None:
        self.stream.write(b"\n]}\n")

    def write_batch(self, batch: Any) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        grouped = _group(batch, self.lanes)
        if grouped is None:
            return
        metadata: list[str] = []
        threads = []
        for key in grouped.tracks:
            group, stage, track, _ = key
            pid = self.pids.get((group, stage))
            if pid is None:
                pid = self.pids[(group, stage)] = len(self.pids) + 1
                name = f"stage: {stage}" if group is None else f"{group} / stage: {stage}"
                metadata.append(json.dumps({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}}))
            tid = self.tids.pop(key, None)
            if tid is None:
                tid = self.next_tid
                self.next_tid += 1
                metadata.append(json.dumps({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                                            "args": {"name": track}}))
            self.tids[key] = tid
            threads.append(f'}}, "pid": {pid}, "tid": {tid}, "ts": ')
        _forget_oldest(self.tids)
        self._emit(",\n".join(metadata))

        heads = []
        for instant, event in grouped.descriptions:
            key = (instant, *(event.get(field) for field in _DESCRIBING))
            found = self.descriptions.get(key)
            if found is None:
                # The record and its args left open: the event's attributes go in args,
                # its thread, timestamp and duration after them.
                found = (json.dumps({"cat": "dfit", "name": self.namer.name(event), "args": self.namer.args(event)})
                         [:-2],
                         ', "ph": "i", "s": "t"}' if instant else ', "ph": "X", "dur": ')
                if len(self.descriptions) < _DESCRIPTION_CACHE:
                    self.descriptions[key] = found
            heads.append(found)
        text = pa.large_string()
        description = pa.array(grouped.description_of_row)
        columns = [pa.array([head for head, _ in heads], text).take(description),
                   _json_attributes(grouped.attributes),
                   pa.array(threads, text).take(pa.array(grouped.track_of_row)),
                   _microseconds(grouped.starts),
                   pa.array([tail for _, tail in heads], text).take(description),
                   pc.if_else(pa.array(grouped.instant), pa.scalar("", text),
                              pc.binary_join_element_wise(_microseconds(grouped.durations), pa.scalar("}", text),
                                                          pa.scalar("", text)))]
        # Every record is preceded by its separator; the first of the file drops it.
        records = pc.binary_join_element_wise(pa.scalar(",\n", text), *columns, pa.scalar("", text)) \
            .cast(pa.large_binary())
        data = memoryview(records.buffers()[2])[:_data_end(records)]
        self._emit(bytes(data[2:]) if self.first else data)
        self.written += grouped.count


def _json_attributes(attributes: Any) -> Any:
    """Each event's ``, "attributes": "…"`` member of its args (empty for none), an Arrow
    string array: the text JSON-escaped column-wise (backslashes and quotes; the rare
    value with control characters goes through ``json.dumps``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    text = attributes.cast(pa.large_string())
    escaped = pc.replace_substring(pc.replace_substring(text, "\\", "\\\\"), '"', '\\"')
    controls = np.asarray(pc.match_substring_regex(text, "[\\x00-\\x1f]"), dtype=bool)
    if controls.any():
        values = escaped.to_pylist()
        for row in np.flatnonzero(controls).tolist():
            values[row] = json.dumps(text[row].as_py())[1:-1]
        escaped = pa.array(values, pa.large_string())
    member = pc.binary_join_element_wise(pa.scalar(', "attributes": "', pa.large_string()), escaped,
                                         pa.scalar('"', pa.large_string()), pa.scalar("", pa.large_string()))
    return pc.if_else(pc.greater(pc.binary_length(text), 0), member, pa.scalar("", pa.large_string()))


def _microseconds(nanoseconds: np.ndarray) -> Any:
    """Nanoseconds as exact decimal microseconds (``1234567`` → ``"1234.567"``), an Arrow
    string array: JSON numbers, with no float rounding of large timestamps."""
    import pyarrow as pa
    import pyarrow.compute as pc

    text = pa.large_string()
    magnitude = np.abs(nanoseconds)
    whole = pc.cast(pa.array(magnitude // 1000), text)
    fraction = pc.utf8_lpad(pc.cast(pa.array(magnitude % 1000), text), 3, "0")
    sign = pc.if_else(pa.array(nanoseconds < 0), pa.scalar("-", text), pa.scalar("", text))
    return pc.binary_join_element_wise(sign, whole, pa.scalar(".", text), fraction, pa.scalar("", text))
