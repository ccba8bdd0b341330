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
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from dfit_mlir import event_schema as es
from dfit_mlir.ids import op_name_of

#: Perfetto's built-in monotonic clock (BUILTIN_CLOCK_MONOTONIC): the HAL host times.
CLOCK_MONOTONIC = 3
_SEQUENCE_ID = 0xDF17
#: Kinds drawn on an invocation's track; the others get a track per operation.
INVOCATION_KINDS = frozenset({"program", "function", "dispatch", "tensor"})
_TENSOR_ARGS = (es.TENSOR_MIN, es.TENSOR_MAX, es.TENSOR_MEAN, es.TENSOR_STD, es.TENSOR_NANS, es.TENSOR_INFS)


#: Event fields the traces read; all but the per-event ones (invocation, start,
#: duration) describe a slice, and runs repeat the same description many times.
_PER_EVENT = (es.INVOCATION, es.START_NS, es.DURATION_NS)
_DESCRIBING = (es.KIND, es.STAGE, es.SITE, es.ROOT_ID, es.PARTITION, es.MACS, es.BYTES, es.ATTRIBUTES, es.NAME,
               *_TENSOR_ARGS)
#: Slice descriptions kept for reuse (distinct ones: call sites, operations).
_DESCRIPTION_CACHE = 100_000


class _SliceNamer:
    """Event → (track key, slice name, args). Per-site and per-op lookups are built once
    and descriptions are memoised by the event's describing fields."""

    def __init__(self, manifest: dict[str, Any]):
        self.operators = {op["id"]: op for op in manifest.get("operators", [])}
        self.sites = manifest.get("partitions", {}).get("dispatch_sites", [])
        self._described: dict[tuple[Any, ...], tuple[str, dict[str, Any]]] = {}

    def track(self, event: dict[str, Any]) -> tuple[str, str]:
        kind = event[es.KIND]
        if kind in INVOCATION_KINDS and event[es.INVOCATION] is not None:
            return event[es.STAGE], f"invocation {event[es.INVOCATION]}"
        return event[es.STAGE], f"{kind}: {event[es.PARTITION] or event.get(es.NAME) or kind}"

    def describe(self, event: dict[str, Any]) -> tuple[tuple[Any, ...], str, dict[str, Any]]:
        """(memo key, slice name, args) of an event."""
        key = tuple(event.get(field) for field in _DESCRIBING)
        found = self._described.get(key)
        if found is None:
            found = (self.name(event), self.args(event))
            if len(self._described) < _DESCRIPTION_CACHE:
                self._described[key] = found
        return key, found[0], found[1]

    def name(self, event: dict[str, Any]) -> str:
        root = event[es.ROOT_ID]
        if root:
            return f"{op_name_of(root) or event[es.KIND]} {root}"
        label = event[es.PARTITION] or event.get(es.NAME)
        return f"{event[es.KIND]} {label}" if label else event[es.KIND]

    def args(self, event: dict[str, Any]) -> dict[str, Any]:
        root = event[es.ROOT_ID]
        source = (self.operators.get(root) or {}).get("source") if root else None
        site_index = event[es.SITE]
        site = self.sites[site_index] if site_index is not None and 0 <= site_index < len(self.sites) else None
        args: dict[str, Any] = {
            "kind": event[es.KIND],
            "partition": event[es.PARTITION],
            "site": site_index if site is not None else None,
            "root_id": root,
            "fused_ids": ", ".join(site["fused_ids"]) if site else None,
            "source": f"{source['file']}:{source['line']}:{source['col']}" if source else None,
            "stage": event[es.STAGE],
            "macs": event[es.MACS],
            "bytes": event[es.BYTES],
            "name": event.get(es.NAME),
            **{name: event.get(name) for name in _TENSOR_ARGS},
        }
        if event[es.ATTRIBUTES]:
            args["attributes"] = event[es.ATTRIBUTES]
        return {name: value for name, value in args.items() if value not in (None, "")}


def _trace_columns(events: Any) -> list[str]:
    """The columns of ``events`` (a ``pq.ParquetFile``) the traces read."""
    return [name for name in (*_PER_EVENT, *_DESCRIBING) if name in events.schema_arrow.names]


def _events(parquet: Path) -> Iterator[dict[str, Any]]:
    """The events of ``parquet`` as dicts of the fields the traces read, column by column
    (a whole-row ``to_pylist`` costs most of the export)."""
    import pyarrow.parquet as pq

    events = pq.ParquetFile(parquet)
    fields = _trace_columns(events)
    for batch in events.iter_batches(batch_size=16_384, columns=fields):
        columns = [_pylist(batch.column(name)) for name in fields]
        for values in zip(*columns, strict=True):
            yield dict(zip(fields, values, strict=True))


def _pylist(column: Any) -> list[Any]:
    """``column.to_pylist()``, 20-40x faster for dictionary columns (decoded by hand)."""
    import pyarrow as pa

    if not pa.types.is_dictionary(column.type):
        return column.to_pylist()
    words = column.dictionary.to_pylist()
    return [None if index is None else words[index] for index in column.indices.to_pylist()]


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

    def flush_into(self, packet: Any) -> None:
        """Attach what was interned since the last flush to ``packet``."""
        if self.pending.ByteSize():
            packet.interned_data.MergeFrom(self.pending)
            self.pending.Clear()


def write_perfetto(parquet: Path, manifest: dict[str, Any], path: Path) -> int:
    """Write ``trace.pftrace`` from ``events.parquet``; returns the number of slices and
    instants written (events without a start time are left out and not counted)."""
    import pyarrow.parquet as pq

    events = pq.ParquetFile(parquet)
    fields = _trace_columns(events)
    with path.open("wb") as stream:
        return PerfettoWriter(manifest, stream).write_batches(
            events.iter_batches(batch_size=_BATCH_ROWS, columns=fields))


#: Events encoded at a time: bounds the writer's memory (~100 bytes of output per event).
_BATCH_ROWS = 65_536
#: TracePacket / TrackEvent field tags (wire type in the low 3 bits), as Perfetto's protos number them.
_TRACE_PACKET = 0x0A  # Trace.packet = 1, length-delimited
_TIMESTAMP = 0x40  # TracePacket.timestamp = 8, varint
_INTERNED_DATA = 0x62  # TracePacket.interned_data = 12, length-delimited
_TRACK_EVENT = 0x5A  # TracePacket.track_event = 11, length-delimited
_TRACK_UUID = 0x58  # TrackEvent.track_uuid = 11, varint
_FLOW_IDS = b"\xf9\x02"  # TrackEvent.flow_ids = 47, fixed64
_SLICE_END = b"\x48\x02"  # TrackEvent.type = 9: TYPE_SLICE_END


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _varint_lengths(values: np.ndarray) -> np.ndarray:
    """Bytes each (non-negative) value takes as a protobuf varint."""
    lengths = np.ones(len(values), dtype=np.int64)
    rest = values.astype(np.uint64) >> np.uint64(7)
    while rest.any():
        lengths += rest > 0
        rest >>= np.uint64(7)
    return lengths


def _put_varints(out: np.ndarray, positions: np.ndarray, values: np.ndarray, lengths: np.ndarray) -> None:
    """Write ``values`` as varints at ``positions`` of ``out`` (all at once, byte k of every value per step)."""
    rest = values.astype(np.uint64)
    for k in range(int(lengths.max(initial=0))):
        has = lengths > k
        byte = (rest & np.uint64(0x7F)).astype(np.uint8) | np.where(lengths > k + 1, 0x80, 0).astype(np.uint8)
        out[positions[has] + k] = byte[has]
        rest = rest >> np.uint64(7)


def _codes(column: Any) -> tuple[np.ndarray, list[Any]]:
    """(code per row, value per code) of an Arrow column; null is a value like any other."""
    import pyarrow as pa
    import pyarrow.compute as pc

    encoded = column if pa.types.is_dictionary(column.type) else pc.dictionary_encode(column)
    values = encoded.dictionary.to_pylist() + [None]
    indices = encoded.indices.fill_null(len(values) - 1)
    return np.asarray(indices, dtype=np.int64), values


def _row_keys(codes: list[tuple[np.ndarray, list[Any]]], count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group rows by their codes: (first row of each group, group of each row, group order)."""
    key = np.zeros(count, dtype=np.int64)
    radix = 1
    for _, values in codes:
        radix *= len(values)
    if radix < 2**62:
        for column, values in codes:
            key = key * len(values) + column
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    else:  # too many distinct combinations for one integer: compare rows
        stacked = np.ascontiguousarray(np.stack([column for column, _ in codes], axis=1))
        _, first, inverse = np.unique(stacked, axis=0, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1), np.argsort(first, kind="stable")


class PerfettoWriter:
    """Events → ``.pftrace`` bytes, encoded a batch of events at a time.

    The wire format is plain protobuf, so packets are written column-wise: what a slice
    looks like (its name, category and arguments, interned) is built once per distinct
    description with Perfetto's own message classes, and each event adds only varints
    (timestamp, track) and the lengths around them, computed for the whole batch with
    numpy. The packets are the ones one ``TracePacket`` object per event would give.

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
        self.uuids: dict[tuple[Any, ...], int] = {}
        self.tracks: dict[tuple[Any, ...], int] = {}
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

    def _track_uuid(self, group: str | None, stage: str, track: str, out: list[bytes]) -> int:
        """The track's uuid; descriptors of tracks new so far (and their parents) go to ``out``."""
        parent = None
        if group is not None:
            parent = self._track((group,), group, None, out)
        stage_uuid = self._track((group, stage), f"stage: {stage}", parent, out)
        return self._track((group, stage, track), track, stage_uuid, out)

    def _track(self, key: tuple[Any, ...], name: str, parent: int | None, out: list[bytes]) -> int:
        uuid = self.tracks.get(key)
        if uuid is None:
            uuid = self.tracks[key] = len(self.tracks) + 1
            encoded = name.encode()
            # TrackDescriptor: uuid = 1, name = 2, parent_uuid = 5; TracePacket.track_descriptor = 60.
            descriptor = b"\x08" + _varint(uuid) + b"\x12" + _varint(len(encoded)) + encoded + \
                (b"\x28" + _varint(parent) if parent is not None else b"")
            packet = b"\xe2\x03" + _varint(len(descriptor)) + descriptor
            out.append(bytes([_TRACE_PACKET]) + _varint(len(packet)) + packet)
        return uuid

    def _description(self, instant: bool, event: dict[str, Any]) -> tuple[bytes, bytes]:
        """(TrackEvent fields of a slice begin or instant, interned data first used by it)."""
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
        interned = b""
        if interner.pending.ByteSize():
            data = interner.pending.SerializeToString()
            interned = bytes([_INTERNED_DATA]) + _varint(len(data)) + data
            interner.pending.Clear()
        return fields, interned

    def write_batches(self, batches: Any) -> int:
        for batch in batches:
            self.write_batch(batch)
        return self.written

    def write_batch(self, batch: Any) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        names = batch.schema.names
        if es.START_NS not in names or not batch.num_rows:
            return
        starts_column = batch.column(es.START_NS)
        if starts_column.null_count:
            batch = batch.filter(pc.is_valid(starts_column))
        count = batch.num_rows
        if not count:
            return
        column = {name: batch.column(name) for name in names}

        def optional(name: str) -> Any:
            return column[name] if name in column else pa.nulls(count, pa.string())

        starts = np.asarray(column[es.START_NS], dtype=np.int64)
        durations = np.asarray(column[es.DURATION_NS].fill_null(0), dtype=np.int64) if es.DURATION_NS in column \
            else np.zeros(count, dtype=np.int64)
        kinds, kind_values = _codes(column[es.KIND])
        tensor_kind = np.array([value == "tensor" for value in kind_values])
        instant = tensor_kind[kinds] | (durations <= 0)

        # Tracks: distinct (group, stage, kind, invocation, partition, name), numbered in first-use order.
        track_columns = [_codes(optional(name)) for name in ("track_group", es.STAGE)] + [(kinds, kind_values)] + \
            [_codes(optional(name)) for name in (es.INVOCATION, es.PARTITION, es.NAME)]
        # An invocation's events share its track whatever their partition; the others, one per operation.
        (invocations, invocation_values), (partitions, partition_values), (names, name_values) = track_columns[3:]
        on_invocation = np.array([value in INVOCATION_KINDS for value in kind_values])[kinds] & \
            (invocations != len(invocation_values) - 1)
        track_columns[3] = (np.where(on_invocation, invocations, len(invocation_values) - 1), invocation_values)
        track_columns[4] = (np.where(on_invocation, len(partition_values) - 1, partitions), partition_values)
        track_columns[5] = (np.where(on_invocation, len(name_values) - 1, names), name_values)
        first, inverse, order = _row_keys(track_columns, count)
        track_of_group = np.zeros(len(first), dtype=np.int64)
        rows = first[order]
        values_of = [[values[code] for code in codes[rows].tolist()] for codes, values in track_columns]
        descriptors: list[bytes] = []
        known = self.uuids
        for group_index, key in zip(order.tolist(), zip(*values_of, strict=True), strict=True):
            uuid = known.get(key)
            if uuid is None:
                group, stage, kind, invocation, partition, name = key
                stage_name, track = self.namer.track({es.KIND: kind, es.STAGE: stage, es.INVOCATION: invocation,
                                                      es.PARTITION: partition, es.NAME: name})
                uuid = known[key] = self._track_uuid(group, stage_name, track, descriptors)
            track_of_group[group_index] = uuid
        self.stream.write(b"".join(descriptors))
        tracks = track_of_group[inverse]

        # Descriptions: distinct (instant, describing fields), built in first-use order.
        describing = [(instant.astype(np.int64), [False, True])] + \
            [_codes(column[name]) if name in column else (np.zeros(count, dtype=np.int64), [None])
             for name in _DESCRIBING]
        first, inverse, order = _row_keys(describing, count)
        fields_of: list[bytes] = [b""] * len(first)
        interned_at: dict[int, bytes] = {}
        for group_index in order:
            row = first[group_index]
            event = {name: describing[k + 1][1][describing[k + 1][0][row]] for k, name in enumerate(_DESCRIBING)}
            fields, interned = self._description(bool(instant[row]), event)
            fields_of[group_index] = fields
            if interned:
                interned_at[int(row)] = interned
        flows: dict[int, bytes] = {}
        if "flow_id" in column and column["flow_id"].null_count < count:
            for row, flow in enumerate(column["flow_id"].to_pylist()):
                if flow is not None:
                    flows[row] = _FLOW_IDS + int(flow).to_bytes(8, "little")
        self._encode(starts, durations, instant, tracks, inverse, fields_of, interned_at, flows)
        self.written += count

    def _encode(self, starts: np.ndarray, durations: np.ndarray, instant: np.ndarray, tracks: np.ndarray,
                descriptions: np.ndarray, fields_of: list[bytes], interned_at: dict[int, bytes],
                flows: dict[int, bytes]) -> None:
        """Every event's packets (begin, then end unless an instant), laid out column-wise.

        A packet is seven segments: [Trace.packet tag, length, timestamp tag, timestamp],
        the shared fields, interned data (first use only), [TrackEvent tag, length], the
        description's fields, a flow (merged traces), [track_uuid tag, uuid]. The varying
        ones are written into small per-packet byte matrices, the constant ones exist once;
        the output is one gather over all of them (``np.repeat`` of segment starts)."""
        count = len(starts)
        packets_per_event = np.where(instant, 1, 2)
        first_packet = np.concatenate([[0], np.cumsum(packets_per_event)[:-1]])
        total = int(packets_per_event.sum())
        event_of = np.repeat(np.arange(count), packets_per_event)
        is_end = np.zeros(total, dtype=bool)
        is_end[first_packet[~instant] + 1] = True
        timestamp = starts[event_of] + np.where(is_end, durations[event_of], 0)
        blobs = [*fields_of, _SLICE_END]
        description_of = np.where(is_end, len(fields_of), descriptions[event_of])
        fields_length = np.array([len(blob) for blob in blobs], dtype=np.int64)[description_of]
        interned_length = np.zeros(total, dtype=np.int64)
        flow_length = np.zeros(total, dtype=np.int64)
        for row, data in interned_at.items():
            interned_length[first_packet[row]] = len(data)
        for row, data in flows.items():
            flow_length[first_packet[row]] = len(data)
        uuid = tracks[event_of]
        uuid_length = _varint_lengths(uuid)
        event_length = fields_length + flow_length + 1 + uuid_length
        event_length_length = _varint_lengths(event_length)
        timestamp_length = _varint_lengths(timestamp)
        body = 1 + timestamp_length + len(self.common) + interned_length + 1 + event_length_length + event_length
        body_length_length = _varint_lengths(body)

        rows = np.arange(total)
        head = np.zeros((total, 14), dtype=np.uint8)  # tag, length (<= 3), tag, timestamp (<= 10)
        head[:, 0] = _TRACE_PACKET
        _put_varints(head.reshape(-1), rows * 14 + 1, body, body_length_length)
        head.reshape(-1)[rows * 14 + 1 + body_length_length] = _TIMESTAMP
        _put_varints(head.reshape(-1), rows * 14 + 2 + body_length_length, timestamp, timestamp_length)
        head_length = 2 + body_length_length + timestamp_length
        event_head = np.zeros((total, 4), dtype=np.uint8)
        event_head[:, 0] = _TRACK_EVENT
        _put_varints(event_head.reshape(-1), rows * 4 + 1, event_length, event_length_length)
        tail = np.zeros((total, 11), dtype=np.uint8)
        tail[:, 0] = _TRACK_UUID
        _put_varints(tail.reshape(-1), rows * 11 + 1, uuid, uuid_length)

        sparse = [interned_at[row] for row in sorted(interned_at)] + [flows[row] for row in sorted(flows)]
        parts = [head.reshape(-1), event_head.reshape(-1), tail.reshape(-1),
                 np.frombuffer(self.common + b"".join(blobs) + b"".join(sparse), dtype=np.uint8)]
        base = np.cumsum([0] + [len(part) for part in parts])
        common_at = base[3]
        blob_at = common_at + len(self.common) + np.concatenate([[0], np.cumsum([len(b) for b in blobs])[:-1]])
        sparse_at = common_at + len(self.common) + sum(len(b) for b in blobs)
        interned_start = np.zeros(total, dtype=np.int64)
        flow_start = np.zeros(total, dtype=np.int64)
        for row in sorted(interned_at):
            interned_start[first_packet[row]] = sparse_at
            sparse_at += len(interned_at[row])
        for row in sorted(flows):
            flow_start[first_packet[row]] = sparse_at
            sparse_at += len(flows[row])
        segment_starts = np.stack([
            base[0] + rows * 14, np.full(total, common_at), interned_start, base[1] + rows * 4,
            blob_at[description_of], flow_start, base[2] + rows * 11], axis=1).reshape(-1)
        segment_lengths = np.stack([
            head_length, np.full(total, len(self.common)), interned_length, 1 + event_length_length,
            fields_length, flow_length, 1 + uuid_length], axis=1).reshape(-1)
        ends = np.cumsum(segment_lengths)
        source = np.concatenate(parts)
        # Output byte k comes from source[k + shift of its segment]; int32 halves the index traffic.
        kind = np.int32 if max(len(source), int(ends[-1])) < 2**31 else np.int64
        index = np.repeat((segment_starts - (ends - segment_lengths)).astype(kind), segment_lengths)
        index += np.arange(len(index), dtype=kind)
        self.stream.write(source.take(index).tobytes())


def write_chrome_json(parquet: Path, manifest: dict[str, Any], path: Path) -> int:
    """Write ``trace.json`` (Chrome trace event format: complete and instant events),
    streaming one event per line."""
    namer = _SliceNamer(manifest)
    pids: dict[str, int] = {}
    tids: dict[tuple[str, str], int] = {}
    written = 0
    with path.open("w") as out:
        out.write('{"displayTimeUnit": "ns", "traceEvents": [\n')
        first = True

        def emit(record: dict[str, Any]) -> None:
            nonlocal first
            out.write(("" if first else ",\n") + json.dumps(record))
            first = False

        for event in _events(parquet):
            if event[es.START_NS] is None:
                continue
            stage, track = namer.track(event)
            if stage not in pids:
                pids[stage] = len(pids) + 1
                emit({"ph": "M", "name": "process_name", "pid": pids[stage], "args": {"name": f"stage: {stage}"}})
            if (stage, track) not in tids:
                tids[(stage, track)] = len(tids) + 1
                emit({"ph": "M", "name": "thread_name", "pid": pids[stage], "tid": tids[(stage, track)],
                      "args": {"name": track}})
            _, name, args = namer.describe(event)
            record = {"cat": "dfit", "name": name, "pid": pids[stage], "tid": tids[(stage, track)],
                      "ts": event[es.START_NS] / 1000, "args": args}
            if event[es.KIND] == "tensor" or not event[es.DURATION_NS]:
                record.update(ph="i", s="t")
            else:
                record.update(ph="X", dur=event[es.DURATION_NS] / 1000)
            emit(record)
            written += 1
        out.write("\n]}\n")
    return written
