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
of serialized slice packets are kept).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

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


def _events(parquet: Path) -> Iterator[dict[str, Any]]:
    """The events of ``parquet`` as dicts of the fields the traces read, column by column
    (a whole-row ``to_pylist`` costs most of the export)."""
    import pyarrow.parquet as pq

    events = pq.ParquetFile(parquet)
    fields = [name for name in (*_PER_EVENT, *_DESCRIBING) if name in events.schema_arrow.names]
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
    instants written (events without a start time are left out and not counted).

    Runs repeat the same slices (one per call site per invocation), so a slice's packet
    is built once (strings interned) and kept serialized; each event then costs a merge of
    those bytes, its track and its timestamp. Packets go out in batches: a pftrace file is
    a sequence of ``Trace`` messages, and concatenated ``Trace``s read as one."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TracePacket, TrackEvent

    namer = _SliceNamer(manifest)
    interner = _Interner()
    written = 0
    uuids: dict[tuple[str, str] | str, int] = {}
    begin_bytes: dict[tuple[Any, ...], bytes] = {}
    end_bytes = _packet(TracePacket(), TrackEvent.TYPE_SLICE_END).SerializeToString()
    batch = Trace()
    start = batch.packet.add()
    start.trusted_packet_sequence_id = _SEQUENCE_ID
    start.sequence_flags = TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    start.first_packet_on_sequence = True

    def descriptor(name: str, parent: int | None) -> int:
        uuid = len(uuids) + 1
        packet = batch.packet.add()
        packet.track_descriptor.uuid = uuid
        packet.track_descriptor.name = name
        if parent is not None:
            packet.track_descriptor.parent_uuid = parent
        return uuid

    def track_uuid(stage: str, track: str) -> int:
        if stage not in uuids:
            uuids[stage] = descriptor(f"stage: {stage}", None)
        if (stage, track) not in uuids:
            uuids[(stage, track)] = descriptor(track, uuids[stage])
        return uuids[(stage, track)]

    def begin_packet(instant: bool, name: str, args: dict[str, Any]) -> bytes:
        packet = _packet(TracePacket(), TrackEvent.TYPE_INSTANT if instant else TrackEvent.TYPE_SLICE_BEGIN)
        packet.track_event.name_iid = interner.iid("event_names", name)
        packet.track_event.category_iids.append(interner.iid("event_categories", "dfit"))
        for arg, value in args.items():
            annotation = packet.track_event.debug_annotations.add()
            annotation.name_iid = interner.iid("debug_annotation_names", arg)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                annotation.string_value_iid = interner.iid("debug_annotation_string_values", str(value))
            elif isinstance(value, int):
                annotation.int_value = value
            else:
                annotation.double_value = value
        return packet.SerializeToString()

    with path.open("wb") as stream:
        for event in _events(parquet):
            if event[es.START_NS] is None:
                continue
            uuid = track_uuid(*namer.track(event))
            duration = event[es.DURATION_NS] or 0
            instant = event[es.KIND] == "tensor" or duration <= 0
            description, name, args = namer.describe(event)
            key = (instant, description)
            cached = begin_bytes.get(key)
            if cached is None:
                cached = begin_packet(instant, name, args)
                if len(begin_bytes) < _PACKET_CACHE:
                    begin_bytes[key] = cached
            begin = batch.packet.add()
            begin.MergeFromString(cached)
            interner.flush_into(begin)
            begin.timestamp = event[es.START_NS]
            begin.track_event.track_uuid = uuid
            if not instant:
                end = batch.packet.add()
                end.MergeFromString(end_bytes)
                end.timestamp = event[es.START_NS] + duration
                end.track_event.track_uuid = uuid
            written += 1
            if len(batch.packet) >= _PACKETS_PER_WRITE:
                stream.write(batch.SerializeToString())
                batch.Clear()
        stream.write(batch.SerializeToString())
    return written


#: Serialized slice packets kept for reuse.
_PACKET_CACHE = _DESCRIPTION_CACHE
_PACKETS_PER_WRITE = 4096


def _packet(packet: Any, event_type: int) -> Any:
    """The fields every slice packet shares (the track and timestamp are set per event)."""
    packet.timestamp_clock_id = CLOCK_MONOTONIC
    packet.trusted_packet_sequence_id = _SEQUENCE_ID
    packet.sequence_flags = packet.SEQ_NEEDS_INCREMENTAL_STATE
    packet.track_event.type = event_type
    return packet


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
