"""Trace exporters for a run bundle: Perfetto's native protobuf format (the ``perfetto``
package's TracePacket builders) and Chrome trace JSON. Both open in the Perfetto UI.

One track per invocation under a process track per stage; each dispatch is a slice
named ``<op> <root id>`` with the export, site, fused IDs, source location and stage in
its args. Input is the normalized ``events.parquet`` table and the manifest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dfit_mlir.ids import op_name_of

#: Perfetto's built-in monotonic clock (BUILTIN_CLOCK_MONOTONIC): the HAL host times.
CLOCK_MONOTONIC = 3
_SEQUENCE_ID = 0xDF17


def _slice_rows(events: Any, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    operators = {op["id"]: op for op in manifest["operators"]}
    sites = manifest["partitions"]["dispatch_sites"]
    rows = []
    for event in events.to_pylist():
        root = event["root_id"]
        source = (operators.get(root) or {}).get("source")
        site = sites[event["site"]] if 0 <= event["site"] < len(sites) else None
        rows.append({
            "name": f"{op_name_of(root) or event['kind']} {root}" if root else event["partition"] or event["kind"],
            "stage": event["stage"],
            "invocation": event["invocation"],
            "start_ns": event["start_ns"],
            "duration_ns": event["duration_ns"],
            "args": {
                "export": event["partition"],
                "site": event["site"],
                "root_id": root,
                "fused_ids": ", ".join(site["fused_ids"]) if site else "",
                "source": f"{source['file']}:{source['line']}:{source['col']}" if source else "",
                "stage": event["stage"],
                "macs": event["macs"],
            },
        })
    return rows


def write_perfetto(events: Any, manifest: dict[str, Any], path: Path) -> int:
    """Write ``trace.pftrace``; returns the number of slices."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

    trace = Trace()
    rows = _slice_rows(events, manifest)
    stage_uuid: dict[str, int] = {}
    track_uuid: dict[tuple[str, int], int] = {}
    for row in rows:
        key = (row["stage"], row["invocation"])
        if row["stage"] not in stage_uuid:
            uuid = stage_uuid[row["stage"]] = len(stage_uuid) + len(track_uuid) + 1
            packet = trace.packet.add()
            packet.track_descriptor.uuid = uuid
            packet.track_descriptor.name = f"stage: {row['stage']}"
        if key not in track_uuid:
            uuid = track_uuid[key] = len(stage_uuid) + len(track_uuid) + 1
            packet = trace.packet.add()
            packet.track_descriptor.uuid = uuid
            packet.track_descriptor.parent_uuid = stage_uuid[row["stage"]]
            packet.track_descriptor.name = f"invocation {row['invocation']}"
    for row in rows:
        uuid = track_uuid[(row["stage"], row["invocation"])]
        begin = trace.packet.add()
        begin.timestamp = row["start_ns"]
        begin.timestamp_clock_id = CLOCK_MONOTONIC
        begin.trusted_packet_sequence_id = _SEQUENCE_ID
        begin.track_event.type = TrackEvent.TYPE_SLICE_BEGIN
        begin.track_event.track_uuid = uuid
        begin.track_event.name = row["name"]
        begin.track_event.categories.append("dfit")
        for name, value in row["args"].items():
            if value in (None, ""):
                continue
            annotation = begin.track_event.debug_annotations.add()
            annotation.name = name
            if isinstance(value, int):
                annotation.int_value = value
            else:
                annotation.string_value = str(value)
        end = trace.packet.add()
        end.timestamp = row["start_ns"] + row["duration_ns"]
        end.timestamp_clock_id = CLOCK_MONOTONIC
        end.trusted_packet_sequence_id = _SEQUENCE_ID
        end.track_event.type = TrackEvent.TYPE_SLICE_END
        end.track_event.track_uuid = uuid
    path.write_bytes(trace.SerializeToString())
    return len(rows)


def write_chrome_json(events: Any, manifest: dict[str, Any], path: Path) -> int:
    """Write ``trace.json`` (Chrome trace event format, complete events)."""
    rows = _slice_rows(events, manifest)
    stages = {stage: index + 1 for index, stage in enumerate(dict.fromkeys(row["stage"] for row in rows))}
    trace_events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"stage: {stage}"}} for stage, pid in stages.items()
    ]
    for row in rows:
        trace_events.append({
            "ph": "X", "cat": "dfit", "name": row["name"], "pid": stages[row["stage"]], "tid": row["invocation"],
            "ts": row["start_ns"] / 1000, "dur": row["duration_ns"] / 1000,
            "args": {name: value for name, value in row["args"].items() if value not in (None, "")},
        })
    path.write_text(json.dumps({"traceEvents": trace_events, "displayTimeUnit": "ns"}))
    return len(rows)
