"""The trace writers as they were before the column-wise encoders, one event at a time:
the Perfetto writer (one ``TracePacket`` object per event, 62-69k events/s) and the
Chrome JSON writer (one ``json.dumps`` per event, ~20k events/s). They are the oracles
the tests hold :func:`dfit_mlir.exporters.perfetto.write_perfetto` and
:func:`dfit_mlir.exporters.chrome.write_chrome_json` against."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from dfit_mlir.core import event_schema as es
from dfit_mlir.exporters.perfetto import _SEQUENCE_ID, CLOCK_MONOTONIC, _Interner
from dfit_mlir.exporters.traces import (
    _PER_EVENT_ARGS,
    DESCRIBING,
    DESCRIPTION_CACHE,
    SliceNamer,
    trace_columns,
    track_name,
)


def write_perfetto_reference(parquet: Path, manifest: dict[str, Any], path: Path) -> int:
    """Write ``trace.pftrace`` from ``events.parquet``; returns the number of slices and
    instants written (events without a start time are left out and not counted).

    Runs repeat the same slices (one per call site per invocation), so a slice's packet
    is built once (strings interned) and kept serialized; each event then costs a merge of
    those bytes, its track and its timestamp. Packets go out in batches: a pftrace file is
    a sequence of ``Trace`` messages, and concatenated ``Trace``s read as one."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TracePacket, TrackEvent

    namer = SliceNamer(manifest)
    described: dict[tuple[Any, ...], tuple[str, dict[str, Any]]] = {}
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
            if arg == "attributes":  # an event's own text: not interned (it rarely repeats)
                annotation.string_value = value
            elif isinstance(value, bool) or not isinstance(value, (int, float)):
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
            uuid = track_uuid(*_track(event))
            duration = event[es.DURATION_NS] or 0
            instant = event[es.KIND] == "tensor" or duration <= 0
            description, name, args = _describe(namer, event, described)
            key = (instant, description)
            cached = begin_bytes.get(key)
            if cached is None:
                cached = begin_packet(instant, name, args)
                if len(begin_bytes) < _PACKET_CACHE:
                    begin_bytes[key] = cached
            begin = batch.packet.add()
            begin.MergeFromString(cached)
            if interner.pending.ByteSize():  # what was interned for this packet goes with it
                begin.interned_data.MergeFrom(interner.pending)
                interner.pending.Clear()
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
_PACKET_CACHE = DESCRIPTION_CACHE
_PACKETS_PER_WRITE = 4096


def _track(event: dict[str, Any]) -> tuple[str, str]:
    """(stage, track name) of an event."""
    return event[es.STAGE], track_name(event[es.KIND], event[es.INVOCATION], event[es.PARTITION], event.get(es.NAME))


def _describe(namer: SliceNamer, event: dict[str, Any],
              memo: dict[tuple[Any, ...], tuple[str, dict[str, Any]]]) -> tuple[tuple[Any, ...], str, dict[str, Any]]:
    """(memo key, slice name, args) of an event, memoised (in ``memo``) by its describing fields."""
    key = tuple(event.get(field) for field in (*DESCRIBING, *_PER_EVENT_ARGS))
    found = memo.get(key)
    if found is None:
        found = (namer.name(event), namer.args(event))
        if len(memo) < DESCRIPTION_CACHE:
            memo[key] = found
    return key, found[0], found[1]


def _packet(packet: Any, event_type: int) -> Any:
    """The fields every slice packet shares (the track and timestamp are set per event)."""
    packet.timestamp_clock_id = CLOCK_MONOTONIC
    packet.trusted_packet_sequence_id = _SEQUENCE_ID
    packet.sequence_flags = packet.SEQ_NEEDS_INCREMENTAL_STATE
    packet.track_event.type = event_type
    return packet


def write_chrome_json_reference(parquet: Path, manifest: dict[str, Any], path: Path) -> int:
    """Write ``trace.json`` (Chrome trace event format: complete and instant events),
    streaming one event per line."""
    namer = SliceNamer(manifest)
    described: dict[tuple[Any, ...], tuple[str, dict[str, Any]]] = {}
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
            stage, track = _track(event)
            if stage not in pids:
                pids[stage] = len(pids) + 1
                emit({"ph": "M", "name": "process_name", "pid": pids[stage], "args": {"name": f"stage: {stage}"}})
            if (stage, track) not in tids:
                tids[(stage, track)] = len(tids) + 1
                emit({"ph": "M", "name": "thread_name", "pid": pids[stage], "tid": tids[(stage, track)],
                      "args": {"name": track}})
            _, name, args = _describe(namer, event, described)
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


def _events(parquet: Path) -> Iterator[dict[str, Any]]:
    """The events of ``parquet`` as dicts of the fields the traces read, column by column
    (a whole-row ``to_pylist`` costs most of the export)."""
    events = es.open_parquet(parquet)
    fields = trace_columns(events)
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
