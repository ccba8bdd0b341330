"""The traces of a long run (issue 29): past a size, the first and last invocations in
full and one summary slice per invocation between, said in ``summary.json``; under it,
the same bytes as the plain writers. On a real ``dfit run --mode full`` bundle of the
convnet (dispatch, queue and memory events), its invocations repeated with shifted
times: a long run in miniature, with a limit scaled down to match."""

from __future__ import annotations

import json
import shutil
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from dfit_mlir.core import event_schema as es
from dfit_mlir.exporters import bundle as bundle_writer
from dfit_mlir.exporters import chrome, perfetto, trace_plan, traces
from dfit_mlir.exporters.trace_plan import KEEP_ALL, TraceLimit
from tests.conftest import read_pftrace

#: Copies of the seed run's invocations: 3 × 12 = 36 invocations, 792 events.
COPIES = 12


@pytest.fixture(scope="module")
def long_run(tmp_path_factory: pytest.TempPathFactory, iree_bundles: dict[str, Path]) -> Path:
    """A folder holding ``events.parquet`` (the seed's events, repeated; one row group
    per copy, as a streamed run writes a window at a time) and ``manifest.json``."""
    seed = iree_bundles["full"]
    folder = tmp_path_factory.mktemp("long-run") / "events-only"
    folder.mkdir()
    shutil.copy(seed / "manifest.json", folder / "manifest.json")
    table = pq.read_table(seed / "events.parquet")
    invocations = pc.max(table.column("invocation")).as_py() + 1
    starts = table.column("start_ns")
    span = pc.max(starts).as_py() - pc.min(starts).as_py() + 1000
    with pq.ParquetWriter(folder / "events.parquet", table.schema) as writer:
        for copy in range(COPIES):
            shifted = table.set_column(table.schema.get_field_index("start_ns"), "start_ns",
                                       pc.add(starts, copy * span))
            shifted = shifted.set_column(shifted.schema.get_field_index("invocation"), "invocation",
                                         pc.add(shifted.column("invocation"),
                                                pa.scalar(copy * invocations, pa.int32())))
            writer.write_table(shifted)
    return folder


def written_bundle(long_run: Path, out: Path, limit: TraceLimit) -> dict[str, Any]:
    out.mkdir()
    for name in ("events.parquet", "manifest.json"):
        shutil.copy(long_run / name, out / name)
    manifest = json.loads((long_run / "manifest.json").read_text())
    return bundle_writer.write_files(out, manifest, {"mode": "full"}, trace_limit=limit)


def chrome_records(path: Path) -> list[dict[str, Any]]:
    return [r for r in json.loads(path.read_text())["traceEvents"] if r["ph"] != "M"]


def nanoseconds(microseconds: Any) -> int:
    return int(Decimal(str(microseconds)) * 1000)


def test_over_the_limit_keeps_the_ends_in_full_and_summarises_between(long_run: Path, tmp_path: Path) -> None:
    events = pq.read_table(long_run / "events.parquet")
    total = events.num_rows
    per_invocation = total // (pc.max(events.column("invocation")).as_py() + 1)  # 22
    limit = TraceLimit(max_events=total // 3)
    summary = written_bundle(long_run, tmp_path / "b", limit)
    keep = (limit.max_events // 2) // (2 * per_invocation)  # whole invocations at each end
    last = pc.max(events.column("invocation")).as_py()
    record = summary["trace"]
    assert record == {"max_events": limit.max_events, "events": total, "kept": "ends",
                      "full_invocations_each_end": keep, "summarised_invocations": last + 1 - 2 * keep,
                      "summarised_range": [keep, last - keep], "summary_slices": last + 1 - 2 * keep}
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["trace"] == record

    invocation = events.column("invocation").to_numpy(zero_copy_only=False)
    in_full = (invocation < keep) | (invocation > last - keep)
    starts = events.column("start_ns").to_numpy()
    ends = starts + events.column("duration_ns").to_numpy()
    # The expected summaries: per summarised invocation, its events' extent and counts.
    expected = {}
    for number in range(keep, last - keep + 1):
        mine = invocation == number
        dispatch = mine & (events.column("kind").cast(pa.string()).to_numpy(zero_copy_only=False) == "dispatch")
        expected[number] = (int(starts[mine].min()), int(ends[mine].max()),
                            {"invocation": number, "events": int(mine.sum()), "dispatches": int(dispatch.sum()),
                             "dispatch_ns": int((ends - starts)[dispatch].sum())})

    # Chrome JSON: every kept event as it is, one summary per invocation between.
    records = chrome_records(tmp_path / "b" / "trace.json")
    summaries = [r for r in records if r["name"] == traces.SUMMARY_SLICE]
    kept = [r for r in records if r["name"] != traces.SUMMARY_SLICE]
    assert sorted((nanoseconds(r["ts"]), nanoseconds(r.get("dur", 0))) for r in kept) == \
        sorted(zip(starts[in_full].tolist(), (ends - starts)[in_full].tolist(), strict=True))
    found = {}
    for r in summaries:
        attributes = json.loads(r["args"]["attributes"])
        found[attributes["invocation"]] = (nanoseconds(r["ts"]), nanoseconds(r["ts"]) + nanoseconds(r["dur"]),
                                           attributes)
    assert found == expected
    assert summary["trace_slices"] == len(records)

    # Perfetto, read the way its trace processor reads it: the same events, the
    # summaries on one track of their own, and every slice closed on its own track.
    tracks, packets = read_pftrace(tmp_path / "b" / "trace.pftrace")
    begins = [(p, name, args) for p, name, args in packets if p.track_event.type != p.track_event.TYPE_SLICE_END]
    assert len(begins) == summary["trace_slices"]
    summary_tracks = {tracks[p.track_event.track_uuid] for p, name, _ in begins if name == traces.SUMMARY_SLICE}
    assert summary_tracks == {traces.SUMMARY_TRACK}
    assert {json.loads(args["attributes"])["invocation"]: p.timestamp for p, name, args in begins
            if name == traces.SUMMARY_SLICE} == {number: start for number, (start, _, _) in expected.items()}
    drawn = {int(name.split()[1]) for name in tracks.values() if name.startswith("invocation ")}
    assert drawn == {number for number in range(last + 1) if number < keep or number > last - keep}
    from tests.test_traces_columnar import packets as raw_packets
    from tests.test_traces_columnar import paired_durations, stream_durations

    found_packets = raw_packets(tmp_path / "b" / "trace.pftrace")
    assert paired_durations(found_packets) == stream_durations(found_packets)


def test_under_the_limit_the_traces_are_the_plain_writers_bytes(long_run: Path, tmp_path: Path) -> None:
    summary = written_bundle(long_run, tmp_path / "b", TraceLimit())
    assert summary["trace"] == {"max_events": trace_plan.TRACE_MAX_EVENTS,
                                "events": pq.ParquetFile(long_run / "events.parquet").metadata.num_rows,
                                "kept": "all"}
    manifest = json.loads((long_run / "manifest.json").read_text())
    perfetto.write_perfetto(long_run / "events.parquet", manifest, tmp_path / "plain.pftrace")
    chrome.write_chrome_json(long_run / "events.parquet", manifest, tmp_path / "plain.json")
    assert (tmp_path / "b" / "trace.pftrace").read_bytes() == (tmp_path / "plain.pftrace").read_bytes()
    assert (tmp_path / "b" / "trace.json").read_bytes() == (tmp_path / "plain.json").read_bytes()
    # ... and keeping all past the limit is the plain writers' bytes too.
    summary = written_bundle(long_run, tmp_path / "all", KEEP_ALL)
    assert summary["trace"]["kept"] == "all" and summary["trace"]["max_events"] is None
    assert (tmp_path / "all" / "trace.pftrace").read_bytes() == (tmp_path / "plain.pftrace").read_bytes()


def test_the_readers_per_row_group_chunk_give_the_same_events(long_run: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A new Parquet reader every few row groups (memory flat in the file's length) reads
    the same rows, and the trace decodes to the same events (batches are cut at the
    readers' boundaries, so new tracks may be described at other places)."""
    from tests.test_traces_columnar import without_tracks

    manifest = json.loads((long_run / "manifest.json").read_text())
    path = long_run / "events.parquet"
    assert pq.ParquetFile(path).metadata.num_row_groups == COPIES
    whole = tmp_path / "whole.pftrace"
    perfetto.write_perfetto(path, manifest, whole)
    monkeypatch.setattr(es, "ROW_GROUPS_PER_READER", 5)
    chunked = tmp_path / "chunked.pftrace"
    perfetto.write_perfetto(path, manifest, chunked)
    rows = pa.Table.from_batches(list(traces.event_batches(path)))
    assert rows.num_rows == pq.ParquetFile(path).metadata.num_rows
    assert rows.column("start_ns").to_pylist() == pq.read_table(path).column("start_ns").to_pylist()
    from tests.test_traces_columnar import packets as raw_packets

    assert without_tracks(raw_packets(chunked)) == without_tracks(raw_packets(whole))


def test_row_groups_of_the_summarised_middle_are_not_read(long_run: Path) -> None:
    """The traces skip the row groups whose events are all summarised (by the footer's
    invocation statistics) and read every event of the others."""
    path = long_run / "events.parquet"
    table = pq.read_table(path)
    per_copy = table.num_rows // COPIES
    invocations = (pc.max(table.column("invocation")).as_py() + 1) // COPIES
    # Copies 3..8 lie wholly inside; copies 2 and 9 straddle the range's ends.
    skipped = (3 * invocations - 1, 9 * invocations)
    read = pa.Table.from_batches(list(traces.event_batches(path, skip_invocations=skipped)))
    assert read.num_rows == table.num_rows - 6 * per_copy
    invocation = table.column("invocation").to_numpy(zero_copy_only=False)
    outside = (invocation < skipped[0]) | (invocation > skipped[1])
    kept = read.column("invocation").to_numpy(zero_copy_only=False)
    assert ((kept < skipped[0]) | (kept > skipped[1])).sum() == outside.sum()


def test_a_row_group_with_events_of_no_invocation_is_read(tmp_path: Path) -> None:
    """SYNTHETIC row groups: one whose invocations all lie in the range but which holds
    an event of no invocation (kept by the plan) is read; one wholly inside is not."""
    path = tmp_path / "events.parquet"
    with pq.ParquetWriter(path, pa.schema([("invocation", pa.int32()), ("start_ns", pa.int64())])) as writer:
        writer.write_table(pa.table({"invocation": pa.array([5, None, 6], pa.int32()), "start_ns": [1, 2, 3]}))
        writer.write_table(pa.table({"invocation": pa.array([7, 8], pa.int32()), "start_ns": [4, 5]}))
    read = pa.Table.from_batches(list(es.row_group_batches(pq.ParquetFile(path), batch_size=10,
                                                           skip_invocations=(0, 10))))
    assert read.column("start_ns").to_pylist() == [1, 2, 3]


def test_track_groups_are_summarised_each_on_their_own_track(long_run: Path) -> None:
    """A merged job's ranks (``track_group``): each rank's invocations summarised apart."""
    events = pq.read_table(long_run / "events.parquet")
    groups = pa.array(["rank 1" if row % 2 else "rank 0" for row in range(events.num_rows)])
    batches = events.append_column("track_group", groups).to_batches(max_chunksize=100)
    plan = trace_plan.plan_trace(events.num_rows, TraceLimit(max_events=200), lambda: batches)
    summaries = pa.Table.from_batches(list(plan.batches([]))[-1:])
    assert plan.totals is not None
    first, last = plan.summarised or (0, 0)
    assert set(summaries.column("track_group").to_pylist()) == {"rank 0", "rank 1"}
    assert len(plan.totals.invocation) == 2 * (last - first + 1)
    assert int(plan.totals.events.sum()) == int(pc.sum(pc.and_(pc.greater_equal(events.column("invocation"), first),
                                                               pc.less_equal(events.column("invocation"), last))
                                                        .cast(pa.int64())).as_py())


@pytest.mark.parametrize("rows", [30, 7])
def test_totals_written_to_a_folder_draw_the_same_summaries(long_run: Path, tmp_path: Path, rows: int,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The summarised invocations' totals written to a folder (as ``dfit run`` plans its
    traces) and read back a batch of slices at a time give the summary slices and the
    record of the totals kept in memory, two track groups and batches of ``rows`` slices."""
    monkeypatch.setattr(trace_plan, "BATCH_ROWS", rows)
    events = pq.read_table(long_run / "events.parquet")
    groups = pa.array(["rank 1" if row % 2 else "rank 0" for row in range(events.num_rows)])
    batches = events.append_column("track_group", groups).to_batches(max_chunksize=100)
    held = trace_plan.plan_trace(events.num_rows, TraceLimit(max_events=200), lambda: batches)
    written = trace_plan.plan_trace(events.num_rows, TraceLimit(max_events=200), lambda: batches, tmp_path)
    assert isinstance(written.totals, trace_plan.SpilledTotals) and isinstance(held.totals, trace_plan.InvocationTotals)
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(trace_plan.TOTALS_COLUMNS)
    assert written.record() == held.record() and held.record()["summarised_invocations"] > 0
    summaries = [pa.Table.from_batches(list(plan._summary_batches())) for plan in (held, written)]
    assert summaries[0].num_rows == len(held.totals) > rows and summaries[0].equals(summaries[1])


@pytest.mark.parametrize(("per_invocation", "budget", "keep"), [
    ([10] * 9, 40, 2),  # 2 + 2 invocations of 10 events fit 40
    ([10] * 9, 5, 1),  # at least one at each end
    ([10] * 5, 1000, 2),  # at least one invocation left between
    ([10] * 2, 1000, 0),  # nothing between to summarise
    ([1, 50, 1, 1, 50, 1], 4, 1),
])
def test_full_invocations_at_each_end(per_invocation: list[int], budget: int, keep: int) -> None:
    events = np.array(per_invocation)
    assert trace_plan._full_at_each_end(events, events[::-1], len(events), budget) == keep
    # Given only the first and last ``budget`` (each invocation has an event, so no more can be kept)
    assert trace_plan._full_at_each_end(events[:budget], events[::-1][:budget], len(events), budget) == keep


def test_sparse_invocation_numbers_keep_every_event() -> None:
    """Invocation numbers far apart (a bundle may hold any up to 2^31 - 1) are not given
    dense per-invocation arrays: the traces keep every event instead."""
    batch = pa.RecordBatch.from_pydict({
        "invocation": pa.array([0, 1, 2, (1 << 31) - 1], pa.int32()), "start_ns": [1, 2, 3, 4],
        "duration_ns": [1, 1, 1, 1], "kind": ["dispatch"] * 4, "stage": ["runtime"] * 4})
    plan = trace_plan.plan_trace(4, TraceLimit(max_events=2), lambda: [batch])
    assert plan.summarised is None and plan.record()["kept"] == "all"


def test_load_time_and_unsubmitted_events_are_kept_not_planned() -> None:
    """Invocation -1 (load time) and -2 (outside any submission), as run bundles write
    them, or any negative number a crafted bundle holds, are no invocation: they are not
    counted into per-invocation arrays (a negative index there raised or wrapped round)
    and fall outside every summarised range, so the writers keep them."""
    numbers = [-2, -1, *range(10), -(1 << 31)]
    batch = pa.RecordBatch.from_pydict({
        "invocation": pa.array(numbers, pa.int32()), "start_ns": list(range(len(numbers))),
        "duration_ns": [1] * len(numbers), "kind": ["dispatch"] * len(numbers), "stage": ["runtime"] * len(numbers)})
    plan = trace_plan.plan_trace(len(numbers), TraceLimit(max_events=4), lambda: [batch])
    assert plan.summarised is not None
    low, high = plan.summarised
    assert 0 < low <= high < 9


@pytest.mark.parametrize("empty", [(), (5,)])
def test_the_summarised_range_takes_only_invocations_with_events(empty: tuple[int, ...]) -> None:
    """SYNTHETIC: invocations 0..9, two events each (one a dispatch), but those of
    ``empty``; the totals between 2 and 8 list exactly the invocations with events (a run
    where all have some: slices of the arrays; otherwise the numbers taken)."""
    from dfit_mlir.exporters.trace_plan import _Accumulator

    numbers = np.array([n for n in range(10) if n not in empty for _ in range(2)], dtype=np.int64)
    starts = numbers * 100 + np.tile([0, 10], len(numbers) // 2)
    totals = _Accumulator()
    totals._add(None, numbers, starts, starts + 5, np.tile([True, False], len(numbers) // 2), np.full(len(numbers), 5))
    found = totals.between(2, 8)
    wanted = [n for n in range(2, 9) if n not in empty]
    assert found.invocation.tolist() == wanted and found.events.tolist() == [2] * len(wanted)
    assert found.first_start.tolist() == [n * 100 for n in wanted] and found.last_end.tolist() == [n * 100 + 15 for n in wanted]
    assert found.dispatches.tolist() == [1] * len(wanted) and found.dispatch_ns.tolist() == [5] * len(wanted)
    assert found.groups == ((None, None, len(wanted)),)
    assert found.groups_of(slice(None)) == [None] * len(wanted)


@pytest.mark.parametrize("sizes", [(50,), (7, 91), (64,)], ids=["50", "7-91", "64"])
def test_the_traces_do_not_depend_on_how_the_events_are_batched(long_run: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  sizes: tuple[int, ...]) -> None:
    """A run's traces are drawn from its events as its pipeline exports them
    (``bundle.StreamedTraces``), in batches other than those ``events.parquet`` gives
    back: cut into batches of ``sizes`` (in turn), the events make the same bytes."""
    monkeypatch.setattr(traces, "ENCODE_ROWS", 32)  # many slices, and batches cut inside them
    manifest = json.loads((long_run / "manifest.json").read_text())
    events = long_run / "events.parquet"
    perfetto.write_perfetto(events, manifest, tmp_path / "read.pftrace")
    chrome.write_chrome_json(events, manifest, tmp_path / "read.json")
    table = pa.Table.from_batches(list(traces.event_batches(events)))
    rebatched, start, turn = [], 0, 0
    while start < table.num_rows:
        size = sizes[turn % len(sizes)]
        rebatched.append(table.slice(start, size).combine_chunks().to_batches()[0])
        start, turn = start + size, turn + 1
    assert len(rebatched) > len(list(traces.event_batches(events)))
    perfetto.write_perfetto_groups(traces.grouped_slices(rebatched), manifest, tmp_path / "cut.pftrace")
    chrome.write_chrome_json_groups(traces.grouped_slices(rebatched), manifest, tmp_path / "cut.json")
    assert (tmp_path / "cut.pftrace").read_bytes() == (tmp_path / "read.pftrace").read_bytes()
    assert (tmp_path / "cut.json").read_bytes() == (tmp_path / "read.json").read_bytes()


@pytest.mark.parametrize("step", [3, 7, 1 << 18])
@pytest.mark.parametrize("max_events", [40, 200, 700])
def test_the_plan_a_few_invocations_at_a_time_is_the_events(long_run: Path, tmp_path: Path, step: int,
                                                             max_events: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan's passes over every invocation (finding the ends, writing the totals) go
    ``STEP`` invocations at a time, its arrays in files of a scratch folder (as ``dfit
    run`` plans): the ends, the range and the totals are those counted from the events
    directly, two track groups, whatever the step; the folder keeps the totals only."""
    monkeypatch.setattr(trace_plan._Accumulator, "STEP", step)
    events = pq.read_table(long_run / "events.parquet")
    groups = pa.array(["rank 1" if row % 3 else "rank 0" for row in range(events.num_rows)])
    batches = events.append_column("track_group", groups).to_batches(max_chunksize=100)
    plan = trace_plan.plan_trace(events.num_rows, TraceLimit(max_events=max_events), lambda: batches, tmp_path)
    # Counted directly: the events of each invocation, the most whole ones at each end
    # that hold half the limit together (at least one), the rest between.
    invocation = events.column("invocation").to_numpy(zero_copy_only=False)
    numbers, per_number = np.unique(invocation, return_counts=True)
    keep = max(1, max(k for k in range(len(numbers) // 2 + 1)
                      if k <= (len(numbers) - 1) // 2 and per_number[:k].sum() + per_number[::-1][:k].sum()
                      <= max_events // 2))
    assert plan.full_each_end == keep
    assert plan.summarised == (int(numbers[keep]), int(numbers[-keep - 1]))
    assert plan.summarised_invocations == len(numbers) - 2 * keep
    assert plan.totals is not None and len(plan.totals) == 2 * (len(numbers) - 2 * keep)
    rows = plan.totals.rows(slice(None))
    between = (invocation >= numbers[keep]) & (invocation <= numbers[-keep - 1])
    assert int(rows["events"].sum()) == int(between.sum())
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(trace_plan.TOTALS_COLUMNS)
