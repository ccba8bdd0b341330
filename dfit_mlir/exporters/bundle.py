"""Writing a run bundle: one directory, written atomically (a temporary sibling renamed
into place; an existing bundle is replaced only once the new one is complete).

* ``manifest.json`` — the compile's manifest;
* ``events.parquet`` — normalized events (``dfit_mlir.core.event_schema``);
* ``sites.parquet`` — the interned IDs: every dispatch call site with its root and
  fused IDs (empty when the manifest has none);
* ``dispatches.csv`` — per call site: count and min/mean/max/total duration;
  ``events.csv`` — per kind and partition: count and durations;
* ``trace.pftrace`` (Perfetto native) and ``trace.json`` (Chrome trace JSON): every
  event, or past a size the first and last invocations in full and a summary slice per
  invocation between (:mod:`dfit_mlir.exporters.trace_plan`; ``trace`` in the summary).
  Drawn from ``events.parquet`` once it is written, or, where the run says how many
  events it may export and the traces keep them all, as the events are exported
  (:class:`StreamedTraces`): the same bytes either way;

Run, reconstruct and merge all write them here (:func:`write_files`).
* ``summary.json`` — mode, policy, counts (dropped included), inputs, versions.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dfit_mlir.core import atomic, toolchain
from dfit_mlir.core import event_schema as es
from dfit_mlir.core import manifest as manifest_io
from dfit_mlir.core.event_pipeline import EventPipeline, ParquetSink, site_table
from dfit_mlir.core.perf import release_freed_memory
from dfit_mlir.exporters.trace_plan import (
    DEFAULT_LIMIT,
    PLAN_COLUMNS,
    TraceLimit,
    TracePlan,
    plan_trace,
)

SUMMARY_SCHEMA = "dfit.run-summary"
SUMMARY_VERSION = "1.2"  # 1.2: ``trace`` (what the traces keep)
#: The output kind of a bundle directory (its marker; see dfit_mlir.core.outputs).
BUNDLE_KIND = "bundle"


def write_bundle(bundle: Path, manifest: dict[str, Any], fill: Callable[[Any], EventPipeline],
                 summary: dict[str, Any], extra_files: dict[str, str] | None = None, *,
                 trace_limit: TraceLimit | None = None, source: str | None = None,
                 stream_traces: bool = False) -> Path:
    """``fill(sink)`` returns a pipeline holding the run's events (not yet closed);
    ``extra_files``: more text files for the bundle (name → content); ``trace_limit``:
    the traces' size limit (default: what the pipeline's policy asks for); ``source``:
    what the events come from, as the error about an event out of the schema's bounds
    names it (no bundle is written then). ``stream_traces`` (with a ``trace_limit``):
    the traces are drawn as the events are exported (:class:`StreamedTraces`), not from
    ``events.parquet`` once it is written, unless ``fill`` withdraws them
    (:func:`withdraw_streamed_traces`: where it finds that the run's events may pass
    the limit, and the traces must be planned over all of them)."""
    try:
        return _write_bundle(bundle, manifest, fill, summary, extra_files, trace_limit, source, stream_traces)
    except OSError as error:  # a full disk: named as the bundle, where Arrow's writer names no file
        if error.filename is not None or not (error.errno in (errno.ENOSPC, errno.EDQUOT)
                                              or "No space left" in str(error)):
            raise
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(bundle)) from None


def _write_bundle(bundle: Path, manifest: dict[str, Any], fill: Callable[[Any], EventPipeline],
                  summary: dict[str, Any], extra_files: dict[str, str] | None, trace_limit: TraceLimit | None,
                  source: str | None, stream_traces: bool) -> Path:
    with atomic.atomic_directory(bundle, kind=BUNDLE_KIND) as tmp:
        streamed = StreamedTraces(tmp, manifest) if trace_limit is not None and stream_traces else None
        sink = ParquetSink(tmp / "events.parquet", source)
        try:
            pipeline = fill(sink if streamed is None else streamed.tee(sink))
            counts = pipeline.close()
            slices = None if streamed is None or streamed.withdrawn else streamed.close()
        finally:
            if streamed is not None:
                streamed.abandon()
        head = {
            "policy": asdict(pipeline.policy),
            "counts": asdict(counts),
            # Dropped at the budget in the pipeline, or earlier by an in-process session.
            "dropped_events": counts.dropped + summary.get("dropped_in_process", 0),
        }
        write_files(tmp, manifest, summary, head=head, extra_files=extra_files,
                    trace_limit=trace_limit or TraceLimit.of(pipeline.policy), traces_written=slices)
    return bundle


#: The traces a bundle holds: Perfetto's and Chrome's.
TRACE_FILES = ("trace.pftrace", "trace.json")


#: Events a streamed trace is handed at a time (:meth:`StreamedTraces.put`): the 65,536
#: of a whole batch at once peaked 5-6 MiB higher in a 990k-event run (279-280 against
#: 284-286 MiB).
PIECE_ROWS = 16_384


class StreamedTraces:
    """Both traces drawn from a run's event batches as the pipeline exports them (a sink
    that writes ``events.parquet`` and hands each batch here too, :meth:`tee`): grouped
    and encoded in threads of their own while the run's events are still being joined,
    instead of read back from ``events.parquet`` afterwards: the same events in the same
    order, encoded in slices cut at the same rows (:func:`~dfit_mlir.exporters.traces.encode_slices`),
    so the same bytes. Only where the traces keep every event (their plan needs no pass
    over the events)."""

    _END = object()

    def __init__(self, folder: Path, manifest: dict[str, Any]):
        import queue
        import threading

        #: One batch waits at most: the join is held back rather than the memory growing (two
        #: waiting peaked 10-20 MiB higher at 990k events: 276-287 against 256-267 MiB).
        self._batches: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._folder = folder
        #: Whether :meth:`withdraw` took the traces back.
        self.withdrawn = False
        self._slices: int | None = None
        self._error: BaseException | None = None
        self._ended = False

        def draw() -> None:
            try:
                self._slices = _draw_traces(folder, manifest, self._drawn())
            except BaseException as error:  # raised by close(), in the run's thread
                self._error = error
                while not self._ended:  # the run still hands its batches over: take them
                    self._ended = self._batches.get() is self._END

        self._thread = threading.Thread(target=draw, name="dfit-traces", daemon=True)
        self._thread.start()

    def _drawn(self) -> Iterator[Any]:
        while (batch := self._batches.get()) is not self._END:
            yield batch
        self._ended = True

    def tee(self, sink: Any) -> Any:
        """``sink`` (where the events are written), handing each batch here as well."""
        return _TeeSink(sink, self)

    def put(self, batch: Any) -> None:
        from dfit_mlir.exporters.traces import trace_column_names

        drawn = batch.select(trace_column_names(batch.schema.names))
        # In pieces (views, no copy): the grouping's temporaries are a piece's, not a
        # whole batch's (the slices are cut at the same rows whatever the pieces).
        for first in range(0, max(1, drawn.num_rows), PIECE_ROWS):
            self._batches.put(drawn.slice(first, PIECE_ROWS))

    def close(self) -> int:
        """Wait for both traces; the slices drawn (a thread's error is raised here)."""
        self._finish()
        if self._error is not None:
            raise self._error
        assert self._slices is not None
        return self._slices

    def abandon(self) -> None:
        """Stop drawing (the run failed or was interrupted); nothing is raised."""
        self._finish()

    def withdraw(self) -> None:
        """Stop drawing and take back what was drawn: the events go on to
        ``events.parquet`` alone, and the traces are drawn from it once it is written."""
        self.withdrawn = True
        self._finish()
        for name in TRACE_FILES:
            (self._folder / name).unlink(missing_ok=True)

    def _finish(self) -> None:
        if self._thread.is_alive():
            self._batches.put(self._END)
            self._thread.join()


class _TeeSink:
    def __init__(self, sink: Any, traces: StreamedTraces):
        self.sink, self.traces = sink, traces

    def export(self, batch: Any) -> None:
        self.sink.export(batch)  # checked there first: the traces draw only what the file holds
        if not self.traces.withdrawn:
            self.traces.put(batch)

    def shutdown(self) -> None:
        self.sink.shutdown()


def withdraw_streamed_traces(sink: Any) -> None:
    """Take back the traces drawn as the events are exported to ``sink`` (what
    :func:`write_bundle`'s ``fill`` was handed), if they are (:meth:`StreamedTraces.withdraw`)."""
    if isinstance(sink, _TeeSink):
        sink.traces.withdraw()


def write_files(folder: Path, manifest: dict[str, Any], summary: dict[str, Any], *,
                head: dict[str, Any] | None = None, trace_batches: Callable[[], Iterable[Any]] | None = None,
                extra_files: dict[str, str] | None = None, trace_limit: TraceLimit = DEFAULT_LIMIT,
                traces_written: int | None = None) -> dict[str, Any]:
    """Every file of a bundle beside ``events.parquet`` (already in ``folder``), written
    here for every kind of bundle (run, reconstruction, merged job): the manifest, the
    call-site table, the CSVs, both traces and ``summary.json`` (``head`` first, then the
    trace's slice count, ``summary`` and the toolchain). ``trace_batches()``: the events
    the traces draw, when they carry more than ``events.parquet`` (a merged job's ranks
    and linked steps). ``trace_limit``: past it, the traces summarise the middle
    invocations (:mod:`dfit_mlir.exporters.trace_plan`). Returns the summary written."""
    import pyarrow.parquet as pq

    from dfit_mlir.exporters.traces import BATCH_ROWS, event_batches

    events = folder / "events.parquet"
    manifest_io.save(manifest, folder / "manifest.json")
    pq.write_table(site_table(manifest), folder / "sites.parquet")
    _grouped_csv(events, folder / "dispatches.csv", kind="dispatch", keys=["site", "partition", "root_id"])
    _grouped_csv(events, folder / "events.csv", kind=None, keys=["kind", "partition"])
    release_freed_memory(now=True)  # the traces start from the live memory, not the CSVs' peak
    events_written = pq.ParquetFile(events).metadata.num_rows
    if traces_written is not None:  # drawn as the events were exported (StreamedTraces)
        plan, slices = TracePlan(events_written, trace_limit.max_events), traces_written
    else:
        # The summarised invocations' totals are written to a scratch folder and read back
        # as the summary slices are drawn, not held through the traces.
        with atomic.scratch_directory("dfit-trace-plan-") as scratch:
            plan = plan_trace(events_written, trace_limit,
                              trace_batches or (lambda: event_batches(events, PLAN_COLUMNS, batch_size=BATCH_ROWS)),
                              scratch)
            release_freed_memory(now=True)  # nor from the plan's (a long run's plan reads every event's invocation)
            # The summarised middle's row groups are not even read (the plan drops their events).
            batches = trace_batches or (lambda: event_batches(events, skip_invocations=plan.summarised))
            slices = _draw_traces(folder, manifest, plan.batches(batches()))
    document = {"schema": SUMMARY_SCHEMA, "version": SUMMARY_VERSION, **(head or {}), "trace_slices": slices,
                "trace": plan.record(), **summary, "toolchain": toolchain.versions()}
    (folder / "summary.json").write_text(json.dumps(document, indent=1) + "\n")
    for name, text in (extra_files or {}).items():
        (folder / name).write_text(text)
    return document


def _draw_traces(folder: Path, manifest: dict[str, Any], batches: Iterable[Any]) -> int:
    """``trace.pftrace`` and ``trace.json`` in ``folder``, of the events of ``batches``
    grouped once and encoded in two threads; the slices drawn."""
    from dfit_mlir.exporters.chrome import write_chrome_json_groups
    from dfit_mlir.exporters.perfetto import write_perfetto_groups
    from dfit_mlir.exporters.traces import grouped_slices, write_in_parallel

    perfetto, chrome = TRACE_FILES
    slices, _ = write_in_parallel(grouped_slices(batches),
                                  lambda groups: write_perfetto_groups(groups, manifest, folder / perfetto),
                                  lambda groups: write_chrome_json_groups(groups, manifest, folder / chrome))
    return int(slices)


def _grouped_csv(events: Path, path: Path, *, kind: str | None, keys: list[str]) -> None:
    """Count and durations of the events of ``kind`` (all when ``None``) per ``keys``,
    grouped a Parquet batch at a time: each batch's partial count, min, max and sum per
    group, then the partials grouped again (the groups are few: call sites, operations),
    so memory does not grow with the run."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    aggregates = [("duration_ns", "count"), ("duration_ns", "min"), ("duration_ns", "max"), ("duration_ns", "sum")]
    partials = []
    handle = pq.ParquetFile(events)
    for batch in es.row_group_batches(handle, batch_size=GROUP_BATCH_ROWS, columns=sorted({*keys, "kind", "duration_ns"})):
        table = pa.Table.from_batches([batch])
        if kind is not None:
            table = table.filter(pc.equal(table.column("kind").cast(pa.string()), kind))
        plain = pa.table({name: (table.column(name).cast(pa.string())
                                 if pa.types.is_dictionary(table.column(name).type) else table.column(name))
                          for name in [*keys, "duration_ns"]})
        partials.append(plain.group_by(keys).aggregate(aggregates))
        release_freed_memory()  # what the batch freed, as it piles up (22M events: +180 MiB kept otherwise)
    schema = pa.schema([*(pa.field(name, pa.string() if pa.types.is_dictionary(handle.schema_arrow.field(name).type)
                                   else handle.schema_arrow.field(name).type) for name in keys),
                        pa.field("duration_ns_count", pa.int64()), pa.field("duration_ns_min", pa.int64()),
                        pa.field("duration_ns_max", pa.int64()), pa.field("duration_ns_sum", pa.int64())])
    merged = pa.concat_tables([part.cast(schema) for part in partials]) if partials else schema.empty_table()
    total = merged.group_by(keys).aggregate([("duration_ns_count", "sum"), ("duration_ns_min", "min"),
                                             ("duration_ns_max", "max"), ("duration_ns_sum", "sum")])
    count, summed = total.column("duration_ns_count_sum"), total.column("duration_ns_sum_sum")
    # The mean as Arrow's ``mean`` of the integers gives it: the exact sum over the count.
    mean = pc.divide(pc.cast(summed, pa.float64()), pc.cast(count, pa.float64()))
    grouped = pa.table({**{name: total.column(name) for name in keys}, "duration_ns_count": count,
                        "duration_ns_min": total.column("duration_ns_min_min"), "duration_ns_mean": mean,
                        "duration_ns_max": total.column("duration_ns_max_max"), "duration_ns_sum": summed}
                       ).sort_by([(key, "ascending") for key in keys])
    pacsv.write_csv(grouped, path)


#: Events grouped at a time for the CSVs.
GROUP_BATCH_ROWS = 131_072
