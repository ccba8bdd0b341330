"""The column-wise Perfetto writer against the per-message writer it replaced
(``tests/perfetto_reference.py``), decoded with Perfetto's own protos, field by field, on
real bundles of every backend; and the track groups and flows ``dfit merge`` uses."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dfit_mlir.exporters import chrome, perfetto, traces
from tests.conftest import bundle_path
from tests.perfetto_reference import write_chrome_json_reference, write_perfetto_reference


def packets(path: Path) -> list[Any]:
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

    return list(Trace.FromString(path.read_bytes()).packet)


@pytest.mark.parametrize("name", ["iree-full", "iree-lite", "iree-ids", "cerebras", "sambanova"])
def test_same_packets_as_one_message_per_event(request: pytest.FixtureRequest, tmp_path: Path, name: str) -> None:
    bundle = bundle_path(request, name)
    manifest = json.loads((bundle / "manifest.json").read_text())
    ours, theirs = tmp_path / "columnar.pftrace", tmp_path / "reference.pftrace"
    written = perfetto.write_perfetto(bundle / "events.parquet", manifest, ours)
    assert written == write_perfetto_reference(bundle / "events.parquet", manifest, theirs)
    assert written > 0
    new, old = packets(ours), packets(theirs)
    # Tracks: the same names under the same parents. The writer emits a batch's new
    # tracks before the batch's events (the reference: before each first use), and puts
    # crossing slices of one track on lanes — more tracks of the same name.
    assert track_names(new) == track_names(old)
    events_new, events_old = without_tracks(new), without_tracks(old)
    assert len(events_new) == len(events_old)
    for ours_packet, their_packet in zip(events_new, events_old, strict=True):
        assert ours_packet == their_packet  # every field, interned data included
    assert paired_durations(new) == stream_durations(new)  # no crossing slices on a track
    if name == "cerebras":  # its phases overlap by float rounding: one track per name would pair them wrongly
        assert paired_durations(old) != stream_durations(old)
    # Varints padded to one width per batch cost a few bytes per packet, no more.
    assert theirs.stat().st_size <= ours.stat().st_size <= 1.1 * theirs.stat().st_size


def track_names(found: list[Any]) -> set[tuple[str, str]]:
    """(track name, parent track name) of every track."""
    names = {p.track_descriptor.uuid: p.track_descriptor.name for p in found if p.HasField("track_descriptor")}
    return {(p.track_descriptor.name, names.get(p.track_descriptor.parent_uuid, ""))
            for p in found if p.HasField("track_descriptor")}


def without_tracks(found: list[Any]) -> list[Any]:
    """The event packets, each track uuid replaced by the track's name (in the packet's
    debug name field, unused otherwise)."""
    names = {p.track_descriptor.uuid: p.track_descriptor.name for p in found if p.HasField("track_descriptor")}
    events = []
    for packet in found:
        if packet.HasField("track_event"):
            copy = type(packet)()
            copy.CopyFrom(packet)
            copy.track_event.name = names[copy.track_event.track_uuid]
            copy.track_event.ClearField("track_uuid")
            events.append(copy)
    return events


def stream_durations(found: list[Any]) -> list[int]:
    """Each slice's duration as written: its END packet follows its BEGIN."""
    events = [p for p in found if p.HasField("track_event")]
    return sorted(end.timestamp - begin.timestamp for begin, end in zip(events, events[1:], strict=False)
                  if begin.track_event.type == begin.track_event.TYPE_SLICE_BEGIN
                  and end.track_event.type == end.track_event.TYPE_SLICE_END)


def paired_durations(found: list[Any]) -> list[int]:
    """Each slice's duration as Perfetto reads it: packets in timestamp order (stable),
    an END closing the most recent open slice of its track."""
    events = sorted((p for p in found if p.HasField("track_event")), key=lambda p: p.timestamp)
    open_slices: dict[int, list[int]] = {}
    durations = []
    for packet in events:
        stack = open_slices.setdefault(packet.track_event.track_uuid, [])
        if packet.track_event.type == packet.track_event.TYPE_SLICE_BEGIN:
            stack.append(packet.timestamp)
        elif packet.track_event.type == packet.track_event.TYPE_SLICE_END:
            durations.append(packet.timestamp - stack.pop())
    return sorted(durations)


@pytest.mark.parametrize("name", ["iree-full", "iree-lite", "iree-ids", "cerebras", "sambanova"])
def test_same_chrome_json_as_one_record_per_event(request: pytest.FixtureRequest, tmp_path: Path, name: str) -> None:
    """The column-wise Chrome JSON writer against the one-``json.dumps``-per-event one:
    the same events in the same order, on the same named processes and threads, with the
    same fields (timestamps parse to the same microseconds)."""
    bundle = bundle_path(request, name)
    manifest = json.loads((bundle / "manifest.json").read_text())
    ours, theirs = tmp_path / "columnar.json", tmp_path / "reference.json"
    written = chrome.write_chrome_json(bundle / "events.parquet", manifest, ours)
    assert written == write_chrome_json_reference(bundle / "events.parquet", manifest, theirs) > 0

    def named(path: Path) -> list[dict[str, Any]]:
        records = json.loads(path.read_text())["traceEvents"]
        processes = {r["pid"]: r["args"]["name"] for r in records if r["ph"] == "M" and r["name"] == "process_name"}
        threads = {(r["pid"], r["tid"]): r["args"]["name"] for r in records
                   if r["ph"] == "M" and r["name"] == "thread_name"}
        return [{**r, "pid": processes[r["pid"]], "tid": threads[(r["pid"], r["tid"])]}
                for r in records if r["ph"] != "M"]

    assert named(ours) == named(theirs)


def test_batches_split_anywhere_give_the_same_trace(tmp_path: Path, iree_bundles: dict[str, Path],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Interning and track numbering carry over between batches (and the slices the
    writer encodes at a time, here as small as the batches)."""
    bundle = iree_bundles["full"]
    manifest = json.loads((bundle / "manifest.json").read_text())
    table = pq.read_table(bundle / "events.parquet")
    whole, split = io.BytesIO(), io.BytesIO()
    perfetto.PerfettoWriter(manifest, whole).write_batches(table.to_batches())
    monkeypatch.setattr(traces, "ENCODE_ROWS", 7)
    perfetto.PerfettoWriter(manifest, split).write_batches(table.to_batches(max_chunksize=7))
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

    def without_descriptors(data: bytes) -> list[Any]:
        return [p for p in Trace.FromString(data).packet if not p.HasField("track_descriptor")]

    assert without_descriptors(whole.getvalue()) == without_descriptors(split.getvalue())


def test_track_groups_and_flows(tmp_path: Path, iree_bundles: dict[str, Path]) -> None:
    bundle = iree_bundles["full"]
    table = pq.read_table(bundle / "events.parquet")
    groups = pa.array(["rank 0" if k % 2 else "rank 1" for k in range(table.num_rows)])
    flows = pa.array([7 if k < 3 else None for k in range(table.num_rows)], pa.uint64())
    out = io.BytesIO()
    written = perfetto.PerfettoWriter({}, out).write_batches(
        table.append_column("track_group", groups).append_column("flow_id", flows).to_batches())
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

    found = Trace.FromString(out.getvalue()).packet
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in found if p.HasField("track_descriptor")}
    roots = {d.name for d in tracks.values() if not d.parent_uuid}
    assert roots == {"rank 0", "rank 1"}
    for descriptor in tracks.values():  # stage tracks hang under a rank, event tracks under a stage
        if descriptor.name.startswith("stage: "):
            assert tracks[descriptor.parent_uuid].name in roots
    begins = [p for p in found if p.HasField("track_event") and p.track_event.type != p.track_event.TYPE_SLICE_END]
    assert len(begins) == written == table.num_rows
    assert [list(p.track_event.flow_ids) for p in begins[:4]] == [[7], [7], [7], []]


@pytest.mark.parametrize("width", [1, 2, 3, 9, 10])
def test_padded_varints_read_back_as_their_values(width: int) -> None:
    """Heads are written with varints padded to one width per batch; Perfetto's protos
    (like protozero, which pads message lengths itself) read them as the plain values."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TracePacket

    limit = min(2**63 - 1, 2 ** (7 * width) - 1)
    values = np.array(sorted(v for v in {0, 1, 127, 128, 300, limit // 2, limit} if v <= limit), dtype=np.uint64)
    rows = np.empty((len(values), width), dtype=np.uint8)
    perfetto._padded_varints(rows, values, width)
    for value, row in zip(values.tolist(), rows, strict=True):
        encoded = bytes([0x40]) + row.tobytes()  # TracePacket.timestamp = 8, varint
        assert len(encoded) == 1 + width
        assert TracePacket.FromString(encoded).timestamp == value


def test_bounded_track_table_still_describes_every_track(monkeypatch: pytest.MonkeyPatch,
                                                         iree_bundles: dict[str, Path]) -> None:
    """The writer remembers only the most recently used tracks (memory stays bounded over
    millions of invocations); a track forgotten and used again is described again, under
    a new uuid and the same name, before its next event."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

    bundle = iree_bundles["full"]
    manifest = json.loads((bundle / "manifest.json").read_text())
    table = pq.read_table(bundle / "events.parquet")
    # Interleave the invocations so that every batch brings back tracks the last one forgot.
    table = table.take(pa.array(sorted(range(table.num_rows), key=lambda row: (row % 5, row))))

    monkeypatch.setattr(traces, "ENCODE_ROWS", 3)  # the writer's slices: 3 events each

    def track_names_per_event(live_tracks: int) -> tuple[list[str], int]:
        monkeypatch.setattr(traces, "LIVE_TRACKS", live_tracks)
        out = io.BytesIO()
        perfetto.PerfettoWriter(manifest, out).write_batches(table.to_batches(max_chunksize=3))
        described: dict[int, str] = {}
        names: list[str] = []
        for packet in Trace.FromString(out.getvalue()).packet:
            if packet.HasField("track_descriptor"):
                described[packet.track_descriptor.uuid] = packet.track_descriptor.name
            elif packet.HasField("track_event"):
                names.append(described[packet.track_event.track_uuid])  # described before use
        return names, len(described)

    bounded, unbounded = track_names_per_event(2), track_names_per_event(1 << 20)
    assert bounded[0] == unbounded[0]
    assert bounded[1] > unbounded[1]  # forgotten tracks were described again


def test_microseconds_are_exact_decimals() -> None:
    """Chrome JSON timestamps are microseconds; written as exact decimals, a boot-time
    nanosecond clock keeps its last digit (a float of microseconds would not)."""
    from decimal import Decimal

    nanoseconds = np.array([0, 1, 999, 1000, 1_234_567, -1_500, -7, 2**62 + 1], dtype=np.int64)
    texts = chrome._microseconds(nanoseconds).to_pylist()
    assert texts[:4] == ["0.000", "0.001", "0.999", "1.000"]
    for value, text in zip(nanoseconds.tolist(), texts, strict=True):
        assert Decimal(text) * 1000 == value
        json.loads(text)  # a JSON number


@pytest.mark.parametrize("values", [
    ['{"a": 1}', 'back\\slash', "tab\tand\nnewline \x01", "", "ünï", '{"a": 1}', ""],
    ['{"a": "q"}', "", "plain", '{"b": [1, 2]}'],  # no backslash anywhere: none replaced
    ['{"shape": [14, 1]}', 'back\\slash "quoted"', ""] * 20,  # few distinct texts: escaped once each
], ids=["mixed", "no-backslash", "repeated"])
def test_attributes_are_json_escaped_once_per_distinct_text(values: list[str]) -> None:
    members = chrome._json_attributes(pa.array([v.encode() for v in values], pa.large_binary())).to_pylist()
    for value, member in zip(values, members, strict=True):
        if not value:
            assert member == ""  # no attributes: no member
        else:
            assert json.loads("{" + member.removeprefix(", ") + "}") == {"attributes": value}


def test_crossing_slices_go_on_lanes_that_nest(monkeypatch: pytest.MonkeyPatch) -> None:
    """SYNTHETIC queue operations of one name that overlap (asynchronous submissions),
    in two batches: each lane nests, lanes keep their open slices across batches, and
    the lanes are tracks of the same name."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

    starts = [0, 10, 15, 40, 45, 100, 105, 110]
    durations = [30, 5, 20, 10, 30, 50, 10, 10]  # [0,30) ⊃ [10,15); [15,35) crosses [0,30); ...
    table = pa.table({"kind": ["queue"] * 8, "stage": ["runtime"] * 8, "partition": ["submit execute"] * 8,
                      "start_ns": pa.array(starts, pa.int64()), "duration_ns": pa.array(durations, pa.int64())})
    out = io.BytesIO()
    monkeypatch.setattr(traces, "ENCODE_ROWS", 4)  # two slices encoded one after the other
    perfetto.PerfettoWriter({}, out).write_batches(table.to_batches(max_chunksize=4))
    found = list(Trace.FromString(out.getvalue()).packet)
    assert paired_durations(found) == sorted(durations)
    names = {p.track_descriptor.uuid: p.track_descriptor.name for p in found if p.HasField("track_descriptor")}
    used = {p.track_event.track_uuid for p in found if p.HasField("track_event")}
    assert len(used) == 2 and {names[uuid] for uuid in used} == {"queue: submit execute"}


@pytest.mark.parametrize("seed", range(20))
def test_lanes_nest_whatever_the_slices(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """SYNTHETIC random slices of several kinds on a few tracks, in random batch sizes:
    Perfetto pairs every END with its own BEGIN."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

    rng = np.random.default_rng(seed)
    count = 300
    starts = np.sort(rng.integers(0, 5_000, count))
    durations = rng.integers(1, 400, count)
    kinds = rng.choice(["program", "function", "dispatch", "queue"], count)
    table = pa.table({"kind": kinds, "stage": ["runtime"] * count,
                      "invocation": pa.array(rng.integers(0, 3, count), pa.int32()),
                      "partition": rng.choice(["a", "b"], count),
                      "start_ns": pa.array(starts, pa.int64()), "duration_ns": pa.array(durations, pa.int64())})
    out = io.BytesIO()
    monkeypatch.setattr(traces, "ENCODE_ROWS", int(rng.integers(5, 60)))  # slices crossing the batches
    perfetto.PerfettoWriter({}, out).write_batches(table.to_batches(max_chunksize=int(rng.integers(7, 120))))
    found = list(Trace.FromString(out.getvalue()).packet)
    assert paired_durations(found) == sorted(durations.tolist())


def test_lanes_nest_when_a_batch_is_out_of_time_order() -> None:
    """SYNTHETIC: the rows of one batch in no particular order (a query's unsorted result)
    still pair every END with its own BEGIN. The timestamps are all distinct: where an END
    and a BEGIN of one track fall on the same nanosecond, Perfetto keeps the stream's order,
    which is right only for rows in time order (as bundles write them)."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

    rng = np.random.default_rng(7)
    count = 200
    stamps = np.sort(rng.choice(1_000_000, (count, 2), replace=False), axis=1)  # 2 × count distinct
    rng.shuffle(stamps)
    starts, durations = stamps[:, 0], stamps[:, 1] - stamps[:, 0]
    table = pa.table({"kind": ["queue"] * count, "stage": ["runtime"] * count, "partition": ["submit"] * count,
                      "start_ns": pa.array(starts, pa.int64()), "duration_ns": pa.array(durations, pa.int64())})
    assert not (np.diff(starts) >= 0).all()  # really out of order
    out = io.BytesIO()
    perfetto.PerfettoWriter({}, out).write_batches(table.to_batches())
    found = list(Trace.FromString(out.getvalue()).packet)
    assert paired_durations(found) == sorted(durations.tolist())
    assert len({p.track_event.track_uuid for p in found if p.HasField("track_event")}) > 1  # overlaps: lanes
