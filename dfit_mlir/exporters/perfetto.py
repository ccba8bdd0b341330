"""``trace.pftrace``: a run's events as Perfetto's native protobuf (TracePacket), streamed.

The writer encodes the protobuf wire format column-wise (:class:`PerfettoWriter`), not
one message object per event; tracks and slices are grouped as
:mod:`dfit_mlir.exporters.traces` says.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from dfit_mlir.core.write_behind import WriteBehind
from dfit_mlir.exporters.traces import (
    DESCRIBING,
    DESCRIPTION_CACHE,
    Grouped,
    Lanes,
    SliceNamer,
    TraceWriter,
    data_end,
    event_batches,
    forget_oldest,
    grouped_slices,
)

#: Perfetto's built-in monotonic clock (BUILTIN_CLOCK_MONOTONIC): the HAL host times.
CLOCK_MONOTONIC = 3


_SEQUENCE_ID = 0xDF17


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
    return write_perfetto_batches(event_batches(parquet), manifest, path)


def write_perfetto_batches(batches: Iterable[Any], manifest: dict[str, Any], path: Path) -> int:
    """:func:`write_perfetto` from event batches (which may add ``track_group`` and
    ``flow_id`` columns: a merged job's ranks and linked steps)."""
    return write_perfetto_groups(grouped_slices(batches), manifest, path)


def write_perfetto_groups(groups: Iterable[Grouped | None], manifest: dict[str, Any], path: Path) -> int:
    """:func:`write_perfetto_batches` of events already grouped
    (:func:`~dfit_mlir.exporters.traces.grouped_slices`)."""
    with path.open("wb") as file, WriteBehind(file.write, name="dfit-trace-writer") as stream:
        return PerfettoWriter(manifest, stream).write_groups(groups)


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


class PerfettoWriter(TraceWriter):
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
        self.namer = SliceNamer(manifest)
        self.interner = _Interner()
        #: Track uuid by the events' track fields, and by (group, stage, track name).
        #: Uuids of the group and stage tracks (few), and of the tracks events are drawn on
        #: by (group, stage, track name): one per invocation, so the writer keeps only the
        #: most recently used :data:`LIVE_TRACKS` of those.
        self.parents: dict[tuple[Any, ...], int] = {}
        self.tracks: OrderedDict[tuple[Any, ...], int] = OrderedDict()
        self.next_uuid = 1
        self.lanes = Lanes()
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
        key = (instant, *(event.get(field) for field in DESCRIBING))
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
        if len(self.descriptions) < DESCRIPTION_CACHE:
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

    def write_grouped(self, grouped: Grouped) -> None:
        import pyarrow.compute as pc

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
        forget_oldest(live)
        self.stream.write(b"".join(parents))
        if new_tracks:
            self.stream.write(_track_descriptors(new_tracks))

        fields_of: list[bytes] = []
        interned_at: dict[int, bytes] = {}
        lengths = np.asarray(pc.binary_length(grouped.attributes), dtype=np.int64)
        present = lengths > 0
        # Names are interned in the order the events first use them: the ``attributes``
        # annotation's name before the descriptions first used after its first row.
        attribute_row = int(np.argmax(present)) if present.any() else None
        for (instant, event), row in zip(grouped.descriptions, grouped.description_rows.tolist(), strict=True):
            if attribute_row is not None and attribute_row < row:
                self._intern_attributes_name(attribute_row, interned_at)
                attribute_row = None
            fields, interned = self._description(instant, event)
            fields_of.append(fields)
            if interned:
                interned_at[row] = interned
        if attribute_row is not None:
            self._intern_attributes_name(attribute_row, interned_at)
        attributes = self._attribute_annotations(grouped.attributes, lengths, present)
        interned_at = {row: bytes([_INTERNED_DATA]) + _varint(len(body)) + body for row, body in interned_at.items()}
        flows = {row: _FLOW_IDS + flow.to_bytes(8, "little") for row, flow in grouped.flows.items()}
        self._encode(grouped.starts, grouped.durations, grouped.instant, uuids[grouped.track_of_row],
                     grouped.description_of_row, fields_of, attributes, interned_at, flows)
        self.written += grouped.count

    def _intern_attributes_name(self, row: int, interned_at: dict[int, bytes]) -> None:
        """Intern the ``attributes`` annotation's name; new, it goes with ``row`` (the first
        event that has one)."""
        self.interner.iid("debug_annotation_names", "attributes")
        body = self._interned_body()
        if body:
            interned_at[row] = interned_at.get(row, b"") + body

    def _attribute_annotations(self, attributes: Any, lengths: np.ndarray, present: np.ndarray) -> list[Any]:
        """Each event's ``attributes`` debug annotation (TrackEvent.debug_annotations = 4:
        name_iid = 1, string_value = 6), column-wise: [] when no event has any, else two
        Arrow columns (fixed-width heads, the text) joined into the TrackEvent. Its name
        is interned already (:meth:`_intern_attributes_name`)."""
        if not present.any():
            return []
        iid = self.interner.iid("debug_annotation_names", "attributes")
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
        self.stream.write(memoryview(packets.buffers()[2])[:data_end(packets)])
