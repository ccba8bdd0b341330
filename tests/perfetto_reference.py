"""The Perfetto writer as it was before the column-wise encoder (one ``TracePacket``
object per event, 62-69k events/s): the oracle the tests hold
:func:`dfit_mlir.traces.write_perfetto` against, field by field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dfit_mlir import event_schema as es
from dfit_mlir.traces import (
    _DESCRIPTION_CACHE,
    _SEQUENCE_ID,
    CLOCK_MONOTONIC,
    _events,
    _Interner,
    _SliceNamer,
)


def write_perfetto_reference(parquet: Path, manifest: dict[str, Any], path: Path) -> int:
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

