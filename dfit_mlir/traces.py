"""Trace exporters for a run bundle: Perfetto's native protobuf format (the ``perfetto``
package's streaming TracePacket builder) and Chrome trace JSON. Both open in the
Perfetto UI.

Tracks: under one process-like track per stage, one track per invocation carrying
``program`` / ``function`` / ``dispatch`` slices (they nest: a function runs inside its
program, dispatches inside both) and ``tensor`` instants; runtime records that belong
to no invocation's model code (``queue`` submissions and host operations, ``memory``
events) get a track per operation. Slices are named ``<op> <root id>`` (dispatches) or
by function / operation, with export, site, fused IDs, source location, stage, MACs
and tensor statistics in their args.

Both writers stream: they read ``events.parquet`` batch by batch and write as they go,
so memory stays bounded however long the run (only the track table is kept).
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


class _SliceNamer:
    """Event row → (track key, slice name, args); per-site and per-op lookups built once."""

    def __init__(self, manifest: dict[str, Any]):
        self.operators = {op["id"]: op for op in manifest.get("operators", [])}
        self.sites = manifest.get("partitions", {}).get("dispatch_sites", [])

    def track(self, event: dict[str, Any]) -> tuple[str, str]:
        kind = event[es.KIND]
        if kind in INVOCATION_KINDS and event[es.INVOCATION] is not None:
            return event[es.STAGE], f"invocation {event[es.INVOCATION]}"
        return event[es.STAGE], f"{kind}: {event[es.PARTITION] or kind}"

    def name(self, event: dict[str, Any]) -> str:
        root = event[es.ROOT_ID]
        if root:
            return f"{op_name_of(root) or event[es.KIND]} {root}"
        return f"{event[es.KIND]} {event[es.PARTITION]}" if event[es.PARTITION] else event[es.KIND]

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
            **{name: event[name] for name in _TENSOR_ARGS},
        }
        if event[es.ATTRIBUTES]:
            args["attributes"] = event[es.ATTRIBUTES]
        return {name: value for name, value in args.items() if value not in (None, "")}


def _events(parquet: Path) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(parquet).iter_batches(batch_size=16_384):
        yield from batch.to_pylist()


def write_perfetto(parquet: Path, manifest: dict[str, Any], path: Path) -> int:
    """Write ``trace.pftrace`` from ``events.parquet``; returns the number of slices and
    instants written (events without a start time are left out and not counted)."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackEvent
    from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder

    namer = _SliceNamer(manifest)
    written = 0
    with path.open("wb") as stream:
        builder = StreamingTraceProtoBuilder(stream)
        uuids: dict[tuple[str, str] | str, int] = {}

        def track_uuid(stage: str, track: str) -> int:
            if stage not in uuids:
                uuids[stage] = _descriptor(builder, len(uuids) + 1, f"stage: {stage}", None)
            key = (stage, track)
            if key not in uuids:
                uuids[key] = _descriptor(builder, len(uuids) + 1, track, uuids[stage])
            return uuids[key]

        for event in _events(parquet):
            if event[es.START_NS] is None:
                continue
            uuid = track_uuid(*namer.track(event))
            duration = event[es.DURATION_NS] or 0
            instant = event[es.KIND] == "tensor" or duration <= 0
            begin = _packet(builder, event[es.START_NS], uuid,
                            TrackEvent.TYPE_INSTANT if instant else TrackEvent.TYPE_SLICE_BEGIN)
            begin.track_event.name = namer.name(event)
            begin.track_event.categories.append("dfit")
            for name, value in namer.args(event).items():
                annotation = begin.track_event.debug_annotations.add()
                annotation.name = name
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    annotation.string_value = str(value)
                elif isinstance(value, int):
                    annotation.int_value = value
                else:
                    annotation.double_value = value
            builder.write_packet(begin)
            if not instant:
                builder.write_packet(_packet(builder, event[es.START_NS] + duration, uuid, TrackEvent.TYPE_SLICE_END))
            written += 1
    return written


def _descriptor(builder: Any, uuid: int, name: str, parent: int | None) -> int:
    packet = builder.create_packet()
    packet.track_descriptor.uuid = uuid
    packet.track_descriptor.name = name
    if parent is not None:
        packet.track_descriptor.parent_uuid = parent
    builder.write_packet(packet)
    return uuid


def _packet(builder: Any, timestamp: int, track: int, event_type: int) -> Any:
    packet = builder.create_packet()
    packet.timestamp = timestamp
    packet.timestamp_clock_id = CLOCK_MONOTONIC
    packet.trusted_packet_sequence_id = _SEQUENCE_ID
    packet.track_event.type = event_type
    packet.track_event.track_uuid = track
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
            record = {"cat": "dfit", "name": namer.name(event), "pid": pids[stage], "tid": tids[(stage, track)],
                      "ts": event[es.START_NS] / 1000, "args": namer.args(event)}
            if event[es.KIND] == "tensor" or not event[es.DURATION_NS]:
                record.update(ph="i", s="t")
            else:
                record.update(ph="X", dur=event[es.DURATION_NS] / 1000)
            emit(record)
            written += 1
        out.write("\n]}\n")
    return written
