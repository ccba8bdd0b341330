"""The windowed route of a ``full`` run (issue 29: ``runtime_hooks/profile_stream.py``,
``run.WindowedRun``) against the whole-run route on real profiles: with windows forced
down to a few dozen records, so that every profile is read in many windows and the
look-ahead is exercised, the events written (each family's values and order: the
windowed route writes them window by window, the whole-run route family by family; each
batch one family's), the summary's figures and the bundle's CSVs are the whole-run
route's — on loops, a data-dependent
``scf.while``, an ``scf.if``, several entry points, an initializer (load time), a warmup,
both CPU drivers — and with host-execution chunks rewritten a flush after their
submissions' (the records of work a call did not wait for), which the look-ahead joins.
A profile the windowed route does not take on (records two windows late, one
invocation), or a window it cannot join, goes to the whole-run route with the reason in
the summary and nothing half written; a damaged profile is exit 2 naming the file and
the byte. The progress bar shows on a terminal only."""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from dfit_mlir.core import manifest as manifest_io
from dfit_mlir.core.errors import EXIT_INVALID_INPUT
from dfit_mlir.core.event_pipeline import MemorySink, Policy
from dfit_mlir.core.paged import PagedArrays
from dfit_mlir.passes.instrumented_compile import CompileResult, compile_instrumented
from dfit_mlir.runtime_hooks import hal_profile, profile_stream, run
from dfit_mlir.runtime_hooks import profile_file as pf
from dfit_mlir.runtime_hooks.progress import Progress, announce
from tests.conftest import CONVNET, REPO, by_family, chrome_trace_slices, same_by_family

pytestmark = pytest.mark.slow
SHAPES = REPO / "tests" / "inputs" / "shapes"
#: name -> (source, function, inputs, repeat, warmup, driver).
CASES = {
    "convnet_warmup_task": (CONVNET, "main", ("1x32x32x3xf32=0.1",), 9, 2, "local-task"),
    "loop_anchor_sync": (SHAPES / "loop.mlir", "main", ("16x16xf32=0.01", "i32=3"), 8, 1, "local-sync"),
    "loop_first_task": (SHAPES / "control_flow_first.mlir", "loop_first", ("2", "16x16xf32=0.01"), 7, 1,
                        "local-task"),
    "while_first_sync": (SHAPES / "control_flow_first.mlir", "while_first", ("16xf32=0.5", "0.0", "300.0"), 6, 0,
                         "local-sync"),
    "if_first_task": (SHAPES / "control_flow_first.mlir", "if_first", ("1", "16x16xf32=0.01"), 6, 1, "local-task"),
    "initializer_sync": (SHAPES / "initializer.mlir", "main", ("8x64xf32=1",), 10, 1, "local-sync"),
}
#: Records per window in these tests: about one flush each, so the look-ahead is one flush.
SMALL_WINDOW = 8


def prerecorded(profile: run.RecordedProfile) -> tuple[Any, PagedArrays]:
    """``_write_full_bundle``'s ``record`` and ``paged`` for a run recorded already (so
    not followed as it was written: nothing joined while it ran)."""
    return (lambda walked: profile), PagedArrays(None)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, CompileResult]:
    root = tmp_path_factory.mktemp("stream-windows")
    flags = {SHAPES / "initializer.mlir": ("--iree-opt-const-eval=false",)}
    return {source: compile_instrumented(source, root / f"{source.stem}.vmfb", mode="full",
                                         flags=flags.get(source, ()))
            for source in sorted({case[0] for case in CASES.values()})}


def recorded(compiled: dict[Path, CompileResult], case: str, folder: Path) -> tuple[run.RecordedProfile, dict[str, Any]]:
    source, function, inputs, repeat, warmup, driver = CASES[case]
    result = compiled[source]
    profile = run._record_run(result.vmfb, inputs, driver, function, repeat, warmup, hal_profile.FULL_FAMILIES,
                              folder)
    return profile, manifest_io.load(result.manifest_path)


def both_routes(profile: run.RecordedProfile, manifest: dict[str, Any], case: str,
                policy: Policy) -> tuple[Any, ...]:
    """(windowed table, whole table, windowed summary, whole summary, windowed batches, whole batches, windows)."""
    _, function, _, repeat, warmup, driver = CASES[case]
    families = hal_profile.FULL_FAMILIES
    windowed = run.WindowedRun.open(profile, manifest, function, repeat, warmup, families, driver)
    sinks = MemorySink(), MemorySink()
    counts = windowed.pipeline(manifest, policy, sinks[0]).close()
    whole = run._whole_run(profile, manifest, function, repeat, warmup, families, driver)
    assert whole.pipeline(manifest, policy, sinks[1]).close() == counts
    tables = [sink.table().drop(["session"]) for sink in sinks]
    # The bound the traces are streamed by (write_bundle's events_at_most) holds.
    assert windowed.events_at_most >= tables[0].num_rows + counts.dropped + counts.filtered + counts.sampled_out
    summary = windowed.summary()
    assert summary.pop("profile_read")["route"] == "windowed"
    return (*tables, summary, whole.summary(), *[[b.num_rows for b in sink.batches] for sink in sinks],
            windowed.index.windows)


def assert_one_family_a_batch(table: Any, batches: list[int], batch_size: int) -> None:
    """Each of the pipeline's ``batches`` (row counts, in order) holds one family's
    events (:func:`by_family`), at most ``batch_size`` of them, and each family's
    batches are whole but its last (fed window by window in turn, each family is
    written as each fills: ``EventPipeline.add_columns``)."""
    assert sum(batches) == table.num_rows and max(batches) <= batch_size
    first, sizes = 0, {}
    for rows in batches:
        (family,) = by_family(table.slice(first, rows))
        sizes.setdefault(family, []).append(rows)
        first += rows
    assert all(size == batch_size for found in sizes.values() for size in found[:-1]), sizes


@pytest.mark.parametrize("case", sorted(CASES))
def test_windowed_route_writes_what_the_whole_run_writes(compiled: dict[Path, CompileResult], case: str,
                                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run, "WINDOW_RECORDS", SMALL_WINDOW)
    profile, manifest = recorded(compiled, case, tmp_path)
    # Small batches too, so that batches are cut inside windows and across them.
    windowed, whole, summary, reference, batches, whole_batches, windows = both_routes(
        profile, manifest, case, Policy(batch_size=7))
    assert windows >= 4, f"{case}: {windows} windows"  # the look-ahead crosses windows
    assert windowed.num_rows == whole.num_rows > 0
    assert same_by_family(windowed, whole), case
    assert not windowed.equals(whole)  # (window by window: the families interleave)
    assert_one_family_a_batch(windowed, batches, 7)
    assert sum(whole_batches) == sum(batches)
    assert summary == reference
    kinds = set(whole.column("kind").to_pylist())
    assert {"dispatch", "queue", "memory"} <= kinds


def test_arrays_kept_in_files_write_what_arrays_in_memory_write(compiled: dict[Path, CompileResult], tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a folder (as ``dfit run`` gives its scratch one), the index walk's columns,
    the run's per-invocation arrays and the index's chunk table are kept in files there,
    mapped, their pages handed back window by window (``core.paged``): the events, their
    batches and the summary are those of the same run with the arrays in memory."""
    from dataclasses import replace

    from dfit_mlir.core.paged import PagedArrays

    monkeypatch.setattr(run, "WINDOW_RECORDS", SMALL_WINDOW)
    case = "loop_first_task"
    _, function, _, repeat, warmup, driver = CASES[case]
    profile, manifest = recorded(compiled, case, tmp_path)
    (tmp_path / "paged").mkdir()
    found = []
    for folder in (None, tmp_path / "paged"):
        # (walked afresh, not followed while the tool ran: the walk writes to the folder too)
        paged = None if folder is None else PagedArrays(folder)
        windowed = run.WindowedRun.open(replace(profile, paged=paged, followed=None), manifest, function, repeat,
                                        warmup, hal_profile.FULL_FAMILIES, driver)
        sink = MemorySink()
        windowed.pipeline(manifest, Policy(batch_size=7), sink).close()
        found.append((sink.table().drop(["session"]), [batch.num_rows for batch in sink.batches], windowed.summary()))
        in_files = [paged is not None and paged.holds(values) for values in (
            windowed.starts, windowed.totals.dispatch_ns, windowed.totals.first, windowed.index.chunk_family,
            windowed.index.chunk_records, windowed.index.chunk_payload_at.within, windowed.index.window_chunks)]
        assert in_files == [folder is not None] * (len(in_files) - 1) + [False]  # (a row per window: small)
    assert windowed.index.windows >= 4
    assert found[0][0].equals(found[1][0]) and found[0][1:] == found[1][1:]
    assert {"dispatch_ns.values", "chunk_family.values", "walk_executions.values", "execution_buffers.values",
            "walk_dispatch_bounds.values", "flush_starts.values"} <= {p.name for p in (tmp_path / "paged").iterdir()}


def test_bundle_files_are_the_whole_runs(compiled: dict[Path, CompileResult], tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Through ``write_bundle``: events.parquet (each family's events in the same order),
    the CSVs, the traces' slices and summary.json (less the session, the toolchain's
    clock and the route) are the whole-run route's. The windowed route draws its traces
    as the events are exported (StreamedTraces): the bytes drawn from its
    events.parquet read back."""
    from dfit_mlir.exporters import bundle, traces

    case = "convnet_warmup_task"
    _, function, _, repeat, warmup, driver = CASES[case]
    profile, manifest = recorded(compiled, case, tmp_path)
    monkeypatch.setattr(run, "WINDOW_RECORDS", SMALL_WINDOW)
    # Slices smaller than the pipeline's batches and not dividing them: slices cross batches.
    monkeypatch.setattr(traces, "ENCODE_ROWS", 37)
    families = hal_profile.FULL_FAMILIES
    streamed = []
    monkeypatch.setattr(bundle.StreamedTraces, "tee", lambda self, sink: streamed.append(self) or
                        bundle._TeeSink(sink, self))
    run._write_full_bundle(tmp_path / "windowed", manifest, Policy(), {"mode": "full"}, *prerecorded(profile),
                           function, repeat, warmup, families, driver)
    assert len(streamed) == 1  # the windowed route's traces were drawn as it exported its events
    whole = run._whole_run(profile, manifest, function, repeat, warmup, families, driver)
    from dfit_mlir.exporters.bundle import write_bundle

    write_bundle(tmp_path / "whole", manifest, lambda sink: whole.pipeline(manifest, Policy(), sink),
                 {"mode": "full", **whole.summary()})
    tables = [pq.read_table(tmp_path / name / "events.parquet").drop(["session"]) for name in ("windowed", "whole")]
    assert same_by_family(tables[0], tables[1])
    for name in ("dispatches.csv", "events.csv"):
        assert (tmp_path / "windowed" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    assert chrome_trace_slices(tmp_path / "windowed" / "trace.json") == chrome_trace_slices(
        tmp_path / "whole" / "trace.json")
    # The traces drawn as the events were exported are those drawn from events.parquet.
    (tmp_path / "redrawn").mkdir()
    (tmp_path / "redrawn" / "events.parquet").write_bytes((tmp_path / "windowed" / "events.parquet").read_bytes())
    bundle.write_files(tmp_path / "redrawn", manifest, {})
    for name in bundle.TRACE_FILES:
        assert (tmp_path / "windowed" / name).read_bytes() == (tmp_path / "redrawn" / name).read_bytes(), name
    summaries = [json.loads((tmp_path / name / "summary.json").read_text()) for name in ("windowed", "whole")]
    assert summaries[0].pop("profile_read")["windows"] >= 4
    for summary in summaries:
        summary.pop("toolchain")
    assert summaries[0] == summaries[1]


def test_a_window_it_cannot_join_falls_back_whole(compiled: dict[Path, CompileResult], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Half-way through the windows (batches already written) the route gives up: the
    half-written bundle is discarded, the whole-run route writes it, the summary says why."""
    case = "convnet_warmup_task"
    _, function, _, repeat, warmup, driver = CASES[case]
    profile, manifest = recorded(compiled, case, tmp_path)
    monkeypatch.setattr(run, "WINDOW_RECORDS", SMALL_WINDOW)
    from dfit_mlir.runtime_hooks import columnar_join

    calls = []
    original = columnar_join.place_blocks

    def fails_late(*args: Any) -> Any:
        calls.append(1)
        return None if len(calls) == 5 else original(*args)

    monkeypatch.setattr(columnar_join, "place_blocks", fails_late)
    run._write_full_bundle(tmp_path / "b", manifest, Policy(batch_size=5), {"mode": "full"},
                           *prerecorded(profile), function, repeat, warmup, hal_profile.FULL_FAMILIES, driver)
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["profile_read"] == {"route": "whole run",
                                       "why": "a window's records are not what the run's were"}
    assert summary["records"]["dispatch"] == repeat * 6
    assert pq.read_table(tmp_path / "b" / "events.parquet").num_rows == summary["counts"]["kept"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "profile.ireeprof"]  # nothing half-written left


def test_one_invocation_takes_the_whole_run_route(compiled: dict[Path, CompileResult], tmp_path: Path) -> None:
    result = compiled[CONVNET]
    bundle = run.run_bundle(result.vmfb, result.manifest_path, tmp_path / "b", mode="full", repeat=1).bundle
    summary = json.loads((bundle / "summary.json").read_text())
    assert summary["profile_read"]["route"] == "whole run"
    assert "one invocation" in summary["profile_read"]["why"]


def _event_chunk(data: bytes, family: bytes = b"-events") -> int:
    offset = struct.unpack_from("<I", data, 8)[0]
    while True:
        length, (header, type_length) = struct.unpack_from("<Q", data, offset)[0], struct.unpack_from(
            "<II", data, offset + 56)
        if data[offset + header:offset + header + type_length].endswith(family):
            return offset
        offset += length


@pytest.mark.parametrize("damage", ["cut_mid_chunk", "cut_mid_header", "wrong_magic", "record_length",
                                    "chunk_length"])
def test_damaged_profile_is_exit_2_naming_the_byte(compiled: dict[Path, CompileResult], tmp_path: Path,
                                                   damage: str) -> None:
    case = "convnet_warmup_task"
    _, function, _, repeat, warmup, driver = CASES[case]
    profile, manifest = recorded(compiled, case, tmp_path)
    data = bytearray(profile.path.read_bytes())
    at = _event_chunk(data, b"memory-events")
    if damage == "wrong_magic":
        data[:4] = b"XXXX"
    elif damage in ("cut_mid_chunk", "cut_mid_header"):
        struct.pack_into("<Q", data, 16, 0)  # an unfinished bundle: no logical length
        data = data[:at + (150 if damage == "cut_mid_chunk" else 50)]
    elif damage == "record_length":  # the first memory event claims another size
        payload_at = at + struct.unpack_from("<Q", data, at)[0] - struct.unpack_from("<Q", data, at + 8)[0]
        struct.pack_into("<I", data, payload_at, 999)
    else:  # a chunk whose length cannot hold its payload
        struct.pack_into("<Q", data, at, 120)
    profile.path.write_bytes(bytes(data))
    with pytest.raises(hal_profile.DamagedProfileError) as error:
        run._write_full_bundle(tmp_path / "b", manifest, Policy(), {"mode": "full"}, *prerecorded(profile),
                               function, repeat, warmup, hal_profile.FULL_FAMILIES, driver)
    assert error.value.exit_code == EXIT_INVALID_INPUT
    message = str(error.value)
    assert str(profile.path) in message and "byte" in message, message
    if damage not in ("wrong_magic",):
        assert f"byte {at}" in message or f"byte {at + 104}" in message or "at byte" in message, message
    assert not (tmp_path / "b").exists()


def test_index_reads_a_profile_in_whole_flush_windows(compiled: dict[Path, CompileResult], tmp_path: Path) -> None:
    """Each window after the first starts at a queue-events chunk and owns the submissions
    from its first one; the facts the index gathers are the whole-run decode's."""
    profile, _ = recorded(compiled, "loop_first_task", tmp_path)
    index = profile_stream.index_profile(profile.path, 16)
    decoded = hal_profile.decode_profile(profile.path, hal_profile.FULL_FAMILIES, 8)
    assert index.windows >= 4
    assert tuple(index.flush_starts.tolist()) == decoded.flush_starts
    assert index.dispatch_records == len(decoded.dispatch_records)
    first_chunks = index.chunk_family[index.window_chunks[1:-1]]
    assert (first_chunks == profile_stream.QUEUE).all()
    assert list(index.window_submissions[1:]) == [s for s in decoded.flush_starts if s in
                                                  set(index.window_submissions[1:].tolist())]
    taken = sum(len(records) for _, records in profile_stream.dispatch_windows(index))
    assert taken == len(decoded.dispatch_records)
    # The cuts, found again one queue chunk at a time: the first queue chunk after the
    # last cut with 16 records or more since it.
    before = np.concatenate([[0], np.cumsum(index.chunk_records)])
    cuts = [0]
    for row in np.flatnonzero(index.chunk_family == profile_stream.QUEUE).tolist():
        if row > cuts[-1] and before[row] - before[cuts[-1]] >= 16:
            cuts.append(row)
    assert index.window_chunks.tolist() == [*cuts, len(index.chunk_family)]
    # Every execute record's (submission, command buffer), distinct and in order.
    from dfit_mlir.runtime_hooks import profile_file

    executions = set()
    for family in ("queue-events", "host-execution-events"):
        found = profile_file.read_profile(profile.path).records[family]
        execute = found["type"] == profile_file.QUEUE_OPS.index("execute")
        executions |= set(zip(found["submission_id"][execute].tolist(), found["command_buffer_id"][execute].tolist(),
                              strict=True))
    assert executions
    assert list(zip(index.executions.submission_id.tolist(), index.executions.command_buffer_id.tolist(),
                    strict=True)) == sorted(executions)


def test_look_ahead_is_checked_in_groups_of_the_walks_blocks(tmp_path: Path) -> None:
    """SYNTHETIC: the walk's per-block arrays are taken in groups of about ``rows`` rows,
    in order, never joined whole, in memory or from a file."""
    from dfit_mlir.core.paged import PagedArrays

    for paged in (PagedArrays(None), PagedArrays(tmp_path)):
        column = paged.appended("bounds", np.int64)
        for part in (np.arange(3), np.arange(3, 4), np.arange(4, 9), np.arange(9, 11)):
            column.add(part)
        groups = [group.tolist() for group in column.groups(4)]
        if paged.on_disk:  # a file read back in groups of exactly ``rows``
            assert groups == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10]]
        else:  # the pieces joined up to ``rows``, a larger one alone, each let go once given
            assert groups == [[0, 1, 2, 3], [4, 5, 6, 7, 8], [9, 10]] and column._pieces == []


def test_the_index_columns_kept_small_read_as_the_whole_ones() -> None:
    """SYNTHETIC: the index's compact columns read as the int64 columns they stand for:
    payload offsets per block (a base and 32-bit offsets from it), one device held once."""
    parts = profile_stream._OffsetParts()
    offsets = [np.array([104, 500, 9000], np.int64), np.array([(5 << 32) + 7], np.int64),
               np.array([(5 << 32) + 8_000_000, (5 << 32) + 8_300_000], np.int64)]
    row = 0
    for block in offsets:
        parts.add(row, block)
        row += len(block)
    column = parts.joined()
    whole = np.concatenate(offsets)
    assert column.within.dtype == np.uint32 and np.array_equal(np.asarray(column), whole)
    assert np.array_equal(column[2:5], whole[2:5]) and int(column[np.int64(3)]) == whole[3]
    assert np.array_equal(column[np.array([5, 0, 3])], whole[[5, 0, 3]])

    one = [np.broadcast_to(np.array([2], np.int32), (4,)), np.array([2], np.int32)]
    device = profile_stream._device_column(one)
    assert device.strides == (0,) and device.tolist() == [2] * 5 and one == []
    mixed = [np.broadcast_to(np.array([2], np.int32), (2,)), np.array([1, 2], np.int32)]
    assert profile_stream._device_column(mixed).tolist() == [2, 2, 1, 2]


@pytest.mark.parametrize("step", [1, 7, 64, 1 << 18])
def test_window_cuts_a_piece_of_the_chunks_at_a_time_are_found_one_by_one(step: int) -> None:
    """SYNTHETIC: the windows cut from the chunk table read ``step`` chunks at a time are
    those found one queue chunk at a time (the first queue chunk after the last cut with
    ``window_records`` records or more since it), each owning its queue chunk's first
    submission."""
    rng = np.random.default_rng(7)
    queue = profile_stream.QUEUE
    family = np.where(rng.random(500) < 0.3, queue, queue + 1).astype(np.int8)
    records = rng.integers(1, 6, 500).astype(np.int32)
    queue_rows = np.flatnonzero(family == queue).tolist()
    flush_starts = np.arange(len(queue_rows), dtype=np.int64) * 10 + 3
    for window_records in (1, 40, 10_000):
        before = np.concatenate([[0], np.cumsum(records)])
        cuts = [0]
        for row in queue_rows:
            if row > cuts[-1] and before[row] - before[cuts[-1]] >= window_records:
                cuts.append(row)
        window_chunks, owned = profile_stream._windows(family, records, flush_starts, window_records, step=step)
        assert window_chunks.tolist() == [*cuts, len(family)]
        assert owned.tolist() == [profile_stream._BEFORE_ALL, *(int(flush_starts[queue_rows.index(row)])
                                                                 for row in cuts[1:])]



def _swap_queue_chunks(path: Path, flush: int) -> None:
    """Rewrite the profile with the queue-events chunks of flushes ``flush`` and
    ``flush + 1`` exchanged (the later flush's submissions written first)."""
    data = path.read_bytes()
    records = _records(data)
    queue = [k for k, (_, _, kind) in enumerate(records) if kind.endswith(b"queue-events")]
    order = list(range(len(records)))
    order[queue[flush]], order[queue[flush + 1]] = order[queue[flush + 1]], order[queue[flush]]
    head = struct.unpack_from("<I", data, 8)[0]
    path.write_bytes(data[:head] + b"".join(data[records[k][0]:records[k][0] + records[k][1]] for k in order))


@pytest.mark.parametrize("block_bytes", [pf.BLOCK_BYTES, 1])
def test_flushes_out_of_order_take_the_whole_run_route(compiled: dict[Path, CompileResult], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch, block_bytes: int) -> None:
    """A flush whose submissions do not all come after the one before's is found as the
    walk goes, within a block or across two (1 byte: a block per record)."""
    monkeypatch.setattr(pf, "BLOCK_BYTES", block_bytes)
    profile, _ = recorded(compiled, "loop_first_task", tmp_path)
    _swap_queue_chunks(profile.path, 2)
    with pytest.raises(profile_stream.WindowedRouteUnavailable,
                       match="flush 3 holds a submission before the previous flush's last"):
        profile_stream.index_profile(profile.path, 16)


def test_a_profile_cut_after_indexing_names_where_it_ends(compiled: dict[Path, CompileResult],
                                                          tmp_path: Path) -> None:
    """The windows are read after the index: a file cut in between (a full disk, a user's
    cleanup) is a ProfileFormatError naming the file and the byte it now ends at."""
    from dfit_mlir.runtime_hooks import profile_file

    profile, _ = recorded(compiled, "loop_first_task", tmp_path)
    index = profile_stream.index_profile(profile.path, 16)
    last = index.windows - 1
    kept = int(index.chunk_payload_at[index.window_chunks[last]])
    with profile.path.open("r+b") as handle:
        handle.truncate(kept)
    assert len(index.family_window("queue-events", 0))  # what is still there reads as before
    with pytest.raises(profile_file.ProfileFormatError, match=f"{profile.path}: the file ends at byte {kept},"):
        index.family_window("queue-events", last)


def test_progress_is_quiet_off_a_terminal() -> None:
    stream = io.StringIO()
    with Progress("dfit: writing events", 10, file=stream) as bar:
        bar.update(10)
    assert not bar.shown and not announce("dfit: profiling", file=stream) and stream.getvalue() == ""


class _Terminal(io.StringIO):
    """What the bar writes, as a terminal would be given it."""

    def isatty(self) -> bool:
        return True


def test_progress_says_how_long_is_left_from_the_first_half_second(monkeypatch: pytest.MonkeyPatch) -> None:
    """The estimate is the pace so far, shown from ESTIMATE_AFTER_SECONDS, rounded up:
    click's own ETA appeared only after a second and read 00:00:00 in the last one (a
    30,000-invocation run writes its 840,000 records in 1.3 s: from 60 %, 00:00:00)."""
    from dfit_mlir.runtime_hooks import progress

    monkeypatch.delenv(progress.QUIET_ENV, raising=False)
    now = [100.0]
    terminal = _Terminal()
    lines = []
    with Progress("dfit: writing events", 1000, file=terminal, clock=lambda: now[0]) as bar:
        for seconds, count in ((0.2, 100), (1.0, 100), (2.0, 300), (3.8, 450), (3.9, 50)):
            now[0] = 100.0 + seconds
            bar.update(count)
            lines.append(terminal.getvalue().rsplit("\r", 1)[-1].rstrip())
    assert bar.shown
    assert [line.split("]")[-1].split() for line in lines] == [
        ["10%"],  # 0.2 s: too early to say
        ["20%", "about", "4", "s", "left"],  # 1.0 s for 200: 4 s for the other 800
        ["50%", "about", "2", "s", "left"],
        ["95%", "about", "1", "s", "left"],  # 0.2 s, rounded up: never "0" while work is left
        ["100%"],
    ]
    assert "00:00:00" not in terminal.getvalue()
    assert [progress._duration(s) for s in (42, 185, 7620)] == ["42 s", "3 min 05 s", "2 h 07 min"]


def test_a_long_run_shows_the_invocations_profiled_so_far(compiled: dict[Path, CompileResult], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """While the tool runs, the bar counts the invocations flushed so far (the queue
    chunks the index's walk has passed as the profile grows) and ends at all of them:
    a long run is not a silent wait (on a terminal only)."""
    import re

    from dfit_mlir.runtime_hooks import progress

    monkeypatch.delenv(progress.QUIET_ENV, raising=False)
    monkeypatch.setattr(run, "ANNOUNCED_INVOCATIONS", 100)
    monkeypatch.setattr(profile_stream, "FOLLOW_BYTES", 32 << 10)  # a step every few invocations
    monkeypatch.setattr(profile_stream, "FOLLOW_POLL_SECONDS", 0.001)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    result = compiled[CONVNET]
    profile = run._record_run(result.vmfb, ("1x32x32x3xf32=0.1",), "local-task", "main", 1500, 5,
                              hal_profile.FULL_FAMILIES, tmp_path)
    drawn = terminal.getvalue()
    assert "dfit: profiling 1505 invocations of main  [" in drawn and "(iree-benchmark-module)" not in drawn
    shown = [int(found) for found in re.findall(r"(\d+)%", drawn)]
    assert shown == sorted(shown) and shown[-1] == 100
    assert any(0 < share < 100 for share in shown), drawn  # counted as the tool ran, not only at its end
    assert profile.followed is not None and profile.followed.queue_chunks <= 1505


def test_progress_shows_on_a_terminal() -> None:
    """On a pseudo-terminal the bar is drawn (and DFIT_NO_PROGRESS turns it off)."""
    script = ("import sys, time; from dfit_mlir.runtime_hooks.progress import Progress, announce\n"
              "announce('dfit: profiling 4 invocations')\n"
              "with Progress('dfit: writing events', 4) as bar:\n"
              "    for _ in range(4): bar.update(1)\n"
              "print('shown' if bar.shown else 'hidden', file=sys.stderr)\n")
    for quiet, expected in ((False, "shown"), (True, "hidden")):
        main, secondary = os.openpty()
        env = {**os.environ, **({"DFIT_NO_PROGRESS": "1"} if quiet else {})}
        env.pop("DFIT_NO_PROGRESS", None) if not quiet else None
        child = subprocess.run([sys.executable, "-c", script], stderr=secondary, stdout=subprocess.DEVNULL,
                               cwd=REPO, env=env, timeout=60)
        os.close(secondary)
        text = b""
        while True:
            try:
                piece = os.read(main, 65536)
            except OSError:
                break
            if not piece:
                break
            text += piece
        os.close(main)
        assert child.returncode == 0
        output = text.decode(errors="replace")
        assert expected in output, output
        assert ("dfit: writing events" in output) == (not quiet), output
        assert ("dfit: profiling 4 invocations" in output) == (not quiet), output


def _records(data: bytes) -> list[tuple[int, int, bytes]]:
    """(offset, length, content type) of every record of a profile, in file order."""
    found, offset = [], struct.unpack_from("<I", data, 8)[0]
    while offset < len(data):
        length, (header, type_length) = struct.unpack_from("<Q", data, offset)[0], struct.unpack_from(
            "<II", data, offset + 56)
        found.append((offset, length, bytes(data[offset + header:offset + header + type_length])))
        offset += length
    return found


def _move_host_chunk(path: Path, flush: int, later: int) -> None:
    """Rewrite the profile with flush ``flush``'s host-execution chunk written after the
    queue-events chunk of flush ``flush + later``, as the records of work a call did not
    wait for are when a later flush writes them (the records themselves unchanged)."""
    data = path.read_bytes()
    records = _records(data)
    queue = [k for k, (_, _, kind) in enumerate(records) if kind.endswith(b"queue-events")]
    host = next(k for k in range(queue[flush], len(records)) if records[k][2].endswith(b"host-execution-events"))
    order = [k for k in range(len(records)) if k != host]
    order.insert(order.index(queue[flush + later]) + 1, host)
    head = struct.unpack_from("<I", data, 8)[0]
    path.write_bytes(data[:head] + b"".join(data[records[k][0]:records[k][0] + records[k][1]] for k in order))


def test_records_a_flush_late_are_joined_by_the_look_ahead(compiled: dict[Path, CompileResult], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    case = "convnet_warmup_task"
    monkeypatch.setattr(run, "WINDOW_RECORDS", SMALL_WINDOW)
    monkeypatch.setattr(profile_stream, "LOOK_AHEAD_ROWS", 2)  # checked in many groups, none is far
    profile, manifest = recorded(compiled, case, tmp_path)
    for flush in (1, 4, 7):
        _move_host_chunk(profile.path, flush, 1)
    index = profile_stream.index_profile(profile.path, SMALL_WINDOW)
    late = 0
    for window in range(1, index.windows):  # records in a window's chunks that the window before owns
        found = index.family_window("host-execution-events", window)
        late += int((found["submission_id"].astype(np.int64) < index.owned(window)[0]).sum())
    assert late >= 3 * 6, late
    windowed, whole, summary, reference, batches, whole_batches, windows = both_routes(
        profile, manifest, case, Policy(batch_size=7))
    assert windows >= 9 and same_by_family(windowed, whole) and summary == reference
    assert_one_family_a_batch(windowed, batches, 7)


@pytest.mark.parametrize("look_ahead_rows", [profile_stream.LOOK_AHEAD_ROWS, 1, 3])
def test_records_two_windows_late_take_the_whole_run_route(compiled: dict[Path, CompileResult], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           look_ahead_rows: int) -> None:
    """The record written too late is found whatever the groups the bounds are checked in."""
    case = "convnet_warmup_task"
    _, function, _, repeat, warmup, driver = CASES[case]
    monkeypatch.setattr(run, "WINDOW_RECORDS", SMALL_WINDOW)
    monkeypatch.setattr(profile_stream, "LOOK_AHEAD_ROWS", look_ahead_rows)
    profile, manifest = recorded(compiled, case, tmp_path)
    _move_host_chunk(profile.path, 2, 3)
    with pytest.raises(profile_stream.WindowedRouteUnavailable, match="more than one window"):
        run.WindowedRun.open(profile, manifest, function, repeat, warmup, hal_profile.FULL_FAMILIES, driver)
    run._write_full_bundle(tmp_path / "b", manifest, Policy(), {"mode": "full"}, *prerecorded(profile),
                           function, repeat, warmup, hal_profile.FULL_FAMILIES, driver)
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["profile_read"]["route"] == "whole run" and "more than one window" in summary["profile_read"]["why"]
    assert summary["records"]["dispatch"] == repeat * 6


def _same_index(found: profile_stream.ProfileIndex, expected: profile_stream.ProfileIndex) -> None:
    for name in ("chunk_family", "chunk_payload_at", "chunk_records", "window_chunks", "window_submissions",
                 "flush_starts", "chunk_device"):
        assert np.array_equal(getattr(found, name), getattr(expected, name)), name
    assert np.array_equal(found.executions.submission_id, expected.executions.submission_id)
    assert np.array_equal(found.executions.command_buffer_id, expected.executions.command_buffer_id)
    assert {k: v.tolist() for k, v in found.types.items()} == {k: v.tolist() for k, v in expected.types.items()}
    assert (found.counts, found.functions, found.numbered, found.dispatch_records, found.first_buffer_windows) == \
        (expected.counts, expected.functions, expected.numbered, expected.dispatch_records,
         expected.first_buffer_windows)


@pytest.mark.parametrize("piece", [13, 777, 4099])
def test_an_index_followed_as_the_profile_is_written_is_the_files_index(compiled: dict[Path, CompileResult],
                                                                         tmp_path: Path, piece: int,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``follow_profile`` walks a profile while the tool writes it (IREE's writer appends
    records, the header's length 0 until it closes the file). Written here ``piece``
    bytes at a time (records and headers cut anywhere), the follower walks what is whole
    as it grows, and the index taken on from it after the file is closed (its columns in
    files) is the finished file's (in memory)."""
    import threading

    from dfit_mlir.core.paged import PagedArrays

    profile, _ = recorded(compiled, "loop_first_task", tmp_path)
    data = bytearray(profile.path.read_bytes())
    (logical_end,) = struct.unpack_from("<Q", data, 16)
    assert logical_end == len(data)
    data[16:24] = bytes(8)  # the writer's header until it closes the file
    monkeypatch.setattr(profile_stream, "FOLLOW_BYTES", 1)  # walk on whatever has grown
    monkeypatch.setattr(profile_stream, "FOLLOW_POLL_SECONDS", 0.0005)
    growing = tmp_path / "growing.ireeprof"
    finished, followed, reached = threading.Event(), [], []
    original = profile_stream._Walk._walk_to

    def walk_to(walk: Any, fd: int, end: int, reader: Any, *, following: bool) -> None:
        original(walk, fd, end, reader, following=following)
        if following:
            reached.append(walk.offset)

    monkeypatch.setattr(profile_stream._Walk, "_walk_to", walk_to)
    # Its columns written to files as it walks (as dfit run's follower does: PagedArrays).
    (tmp_path / "paged").mkdir()
    paged = PagedArrays(tmp_path / "paged")
    follower = threading.Thread(target=lambda: followed.append(profile_stream.follow_profile(growing, finished,
                                                                                             paged)))
    follower.start()
    with growing.open("wb") as out:
        waited = 0
        for at in range(0, len(data), piece):
            out.write(data[at:at + piece])
            out.flush()
            if at - waited >= 8192:  # now and then, let the follower catch up with what is whole
                waited = at
                for _ in range(400):
                    if reached and reached[-1] >= at - 4096:
                        break
                    threading.Event().wait(0.0005)
        finished.set()
        follower.join()
        out.seek(16)
        out.write(struct.pack("<Q", len(data)))  # closed: the header's length filled in
    [walk] = followed
    assert walk is not None and len(reached) > 3  # it walked as the file grew
    assert len(set(reached)) > 3 and 24 < walk.offset <= len(data)
    index = profile_stream.index_profile(growing, followed=walk)
    assert paged.holds(index.chunk_family) and paged.holds(index.executions.submission_id)
    _same_index(index, profile_stream.index_profile(profile.path))


def test_a_follower_of_a_damaged_profile_leaves_the_error_to_the_index(tmp_path: Path) -> None:
    """A follower that cannot walk the file (here: no profile's magic) gives up quietly;
    the index, walking afresh, names the file as it does without one."""
    import threading

    from dfit_mlir.runtime_hooks.profile_file import ProfileFormatError

    bad = tmp_path / "bad.ireeprof"
    bad.write_bytes(b"NOPE" + bytes(200))
    finished = threading.Event()
    finished.set()
    assert profile_stream.follow_profile(bad, finished) is not None  # set at once: nothing was read
    finished.clear()
    timer = threading.Timer(0.3, finished.set)
    timer.start()
    followed = profile_stream.follow_profile(bad, finished)
    assert followed is None
    with pytest.raises(ProfileFormatError, match=str(bad)):
        profile_stream.index_profile(bad, followed=followed)


def _written_as_a_tool_writes(data: bytes, path: Path, walked_to: list[int], piece: int = 4099) -> None:
    """Write a profile's bytes to ``path`` as IREE's writer does while a run goes on:
    appended ``piece`` bytes at a time (records cut anywhere), the header's length 0
    until the file is closed; after each piece, a follower (that appends where its walk
    got to to ``walked_to``) is given a second to walk what is whole."""
    import time

    growing = bytearray(data)
    growing[16:24] = bytes(8)
    with path.open("wb") as out:
        for at in range(0, len(growing), piece):
            out.write(growing[at:at + piece])
            out.flush()
            waited = time.monotonic()
            while not (walked_to and walked_to[-1] >= at - 4096) and time.monotonic() - waited < 1:
                time.sleep(0.0005)
        out.seek(16)
        out.write(data[16:24])


@pytest.mark.parametrize("case,variant", [*((case, "as written") for case in sorted(CASES)),
                                          ("convnet_warmup_task", "starts wrong"),
                                          ("loop_first_task", "starts wrong"),
                                          ("convnet_warmup_task", "names wrong"),
                                          ("convnet_warmup_task", "traces withdrawn")])
def test_windows_joined_while_the_tool_runs_are_the_bundle_joined_after(compiled: dict[Path, CompileResult],
                                                                        case: str, variant: str, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``dfit run --mode full`` joins the dispatch windows it can while the tool still
    writes the profile (``run.EarlyJoin``). The run's real profile written again here as
    the tool writes it (a piece at a time, the length filled in at the end), the bundle —
    events.parquet, the CSVs, both traces, the summary but for how the profile was read
    — is the one written from the finished file, and most windows were joined early.
    Where the starts it placed invocations by, or the event names it coded the rows
    into (an operation first seen after it stopped), are not the finished profile's
    (made wrong here), what it joined is discarded and the bundle written again, the
    summary saying why; where the run turns out to pass the traces' limit after its traces were
    drawn as the events were exported, they are drawn again from events.parquet."""
    import dataclasses
    import threading

    from dfit_mlir.core.paged import PagedArrays
    from dfit_mlir.runtime_hooks import join_records

    if variant == "starts wrong":
        so_far = join_records.invocation_starts_so_far
        monkeypatch.setattr(join_records, "invocation_starts_so_far",
                            lambda *args: None if (found := so_far(*args)) is None else found + 1)
    if variant == "names wrong":  # as if a name turned up in a window not yet walked
        labels_of = run.row_labels
        monkeypatch.setattr(run, "row_labels", lambda index: {
            family: (*names, "zz later") if threading.current_thread().name == "dfit-follow" else names
            for family, names in labels_of(index).items()})
    if variant == "traces withdrawn":
        withdrawn = []
        monkeypatch.setattr(run.WindowedRun, "events_at_most", property(lambda self: 10**9))
        withdraw = run.withdraw_streamed_traces
        monkeypatch.setattr(run, "withdraw_streamed_traces", lambda sink: withdrawn.append(withdraw(sink)))

    source, function, inputs, repeat, warmup, driver = CASES[case]
    profile, manifest = recorded(compiled, case, tmp_path)
    profile = dataclasses.replace(profile, wall_ns_per_invocation=None)  # (the stand-in tool says none)
    monkeypatch.setattr(run, "WINDOW_RECORDS", SMALL_WINDOW)
    monkeypatch.setattr(profile_stream, "FOLLOW_BYTES", 1)
    monkeypatch.setattr(profile_stream, "FOLLOW_POLL_SECONDS", 0.0005)
    data = profile.path.read_bytes()

    walked_to: list[int] = []

    class Tool:
        """The tool's stand-in: writes the profile in a thread, from when it is started."""

        def __init__(self, path: Path):
            self.writing = threading.Thread(target=_written_as_a_tool_writes, args=(data, path, walked_to))
            self.writing.start()

        def wait(self) -> tuple[str, str]:
            self.writing.join()
            return "iree-run-module", ""

        def stop(self) -> None:
            self.writing.join()

    monkeypatch.setattr(hal_profile, "start_profiling", lambda vmfb, tool_inputs, path, **_: Tool(path))
    (tmp_path / "run").mkdir()
    (tmp_path / "paged").mkdir()
    paged = PagedArrays(tmp_path / "paged")
    families = hal_profile.FULL_FAMILIES

    def record(early: Any) -> run.RecordedProfile:
        def walked(walk: Any, finished: Any) -> None:
            early(walk, finished)
            walked_to.append(walk.offset)

        started = run.StartedRun.start(compiled[source].vmfb, inputs, driver, function, repeat, warmup, families,
                                       tmp_path / "run", paged)
        return started.finish(None, walked)

    run._write_full_bundle(tmp_path / "early", manifest, Policy(), {"mode": "full"}, record, paged, function,
                           repeat, warmup, families, driver)
    run._write_full_bundle(tmp_path / "after", manifest, Policy(), {"mode": "full"}, *prerecorded(profile),
                           function, repeat, warmup, families, driver)
    tables = [pq.read_table(tmp_path / name / "events.parquet").drop(["session"]) for name in ("early", "after")]
    assert tables[0].num_rows > 0 and tables[0].equals(tables[1])
    for name in ("dispatches.csv", "events.csv", "trace.json", "trace.pftrace"):
        assert (tmp_path / "early" / name).read_bytes() == (tmp_path / "after" / name).read_bytes(), name
    summaries = [json.loads((tmp_path / name / "summary.json").read_text()) for name in ("early", "after")]
    read = [summary.pop("profile_read") for summary in summaries]
    for summary in summaries:
        summary.pop("toolchain")
    assert summaries[0] == summaries[1]
    assert read[1]["joined_while_profiling"] == 0 and read[0]["route"] == "windowed" and read[0]["windows"] >= 4
    if variant in ("starts wrong", "names wrong"):
        assert read[0]["joined_while_profiling"] == 0, read[0]
        # Found by the check after the tool, by the join of a window, or by the sink's check
        # of an event placed before the first invocation: each discards what was joined.
        assert read[0]["joined_while_profiling_discarded"], read[0]
        return
    assert "joined_while_profiling_discarded" not in read[0]
    assert read[0]["joined_while_profiling"] >= read[0]["windows"] // 2, read[0]
    if variant == "traces withdrawn":
        assert len(withdrawn) == 2  # (the reference's traces are withdrawn before any event)
