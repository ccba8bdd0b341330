"""Writing a run bundle: one directory, written atomically (a temporary sibling renamed
into place; an existing bundle is replaced only once the new one is complete).

* ``manifest.json`` — the compile's manifest;
* ``events.parquet`` — normalized events (``dfit_mlir.core.event_schema``);
* ``sites.parquet`` — the interned IDs: every dispatch call site with its root and
  fused IDs (empty when the manifest has none);
* ``dispatches.csv`` — per call site: count and min/mean/max/total duration;
  ``events.csv`` — per kind and partition: count and durations;
* ``trace.pftrace`` (Perfetto native) and ``trace.json`` (Chrome trace JSON);

Run, reconstruct and merge all write them here (:func:`write_files`).
* ``summary.json`` — mode, policy, counts (dropped included), inputs, versions.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dfit_mlir.core import atomic, toolchain
from dfit_mlir.core import manifest as manifest_io
from dfit_mlir.core.event_pipeline import EventPipeline, ParquetSink, site_table

SUMMARY_SCHEMA = "dfit.run-summary"
SUMMARY_VERSION = "1.1"
#: The output kind of a bundle directory (its marker; see dfit_mlir.core.outputs).
BUNDLE_KIND = "bundle"


def write_bundle(bundle: Path, manifest: dict[str, Any], fill: Callable[[ParquetSink], EventPipeline],
                 summary: dict[str, Any], extra_files: dict[str, str] | None = None) -> Path:
    """``fill(sink)`` returns a pipeline holding the run's events (not yet closed);
    ``extra_files``: more text files for the bundle (name → content)."""
    with atomic.atomic_directory(bundle, kind=BUNDLE_KIND) as tmp:
        pipeline = fill(ParquetSink(tmp / "events.parquet"))
        counts = pipeline.close()
        head = {
            "policy": asdict(pipeline.policy),
            "counts": asdict(counts),
            # Dropped at the budget in the pipeline, or earlier by an in-process session.
            "dropped_events": counts.dropped + summary.get("dropped_in_process", 0),
        }
        write_files(tmp, manifest, summary, head=head, extra_files=extra_files)
    return bundle


def write_files(folder: Path, manifest: dict[str, Any], summary: dict[str, Any], *,
                head: dict[str, Any] | None = None, trace_batches: Callable[[], Iterable[Any]] | None = None,
                extra_files: dict[str, str] | None = None) -> dict[str, Any]:
    """Every file of a bundle beside ``events.parquet`` (already in ``folder``), written
    here for every kind of bundle (run, reconstruction, merged job): the manifest, the
    call-site table, the CSVs, both traces and ``summary.json`` (``head`` first, then the
    trace's slice count, ``summary`` and the toolchain). ``trace_batches()``: the events
    the traces draw, when they carry more than ``events.parquet`` (a merged job's ranks
    and linked steps). Returns the summary written."""
    import pyarrow.parquet as pq

    from dfit_mlir.exporters.chrome import write_chrome_json_batches
    from dfit_mlir.exporters.perfetto import write_perfetto_batches
    from dfit_mlir.exporters.traces import event_batches

    events = folder / "events.parquet"
    manifest_io.save(manifest, folder / "manifest.json")
    pq.write_table(site_table(manifest), folder / "sites.parquet")
    _grouped_csv(events, folder / "dispatches.csv", kind="dispatch", keys=["site", "partition", "root_id"])
    _grouped_csv(events, folder / "events.csv", kind=None, keys=["kind", "partition"])
    batches = trace_batches or (lambda: event_batches(events))
    slices = write_perfetto_batches(batches(), manifest, folder / "trace.pftrace")
    write_chrome_json_batches(batches(), manifest, folder / "trace.json")
    document = {"schema": SUMMARY_SCHEMA, "version": SUMMARY_VERSION, **(head or {}), "trace_slices": slices,
                **summary, "toolchain": toolchain.versions()}
    (folder / "summary.json").write_text(json.dumps(document, indent=1) + "\n")
    for name, text in (extra_files or {}).items():
        (folder / name).write_text(text)
    return document


def _grouped_csv(events: Path, path: Path, *, kind: str | None, keys: list[str]) -> None:
    """Count and durations of the events of ``kind`` (all when ``None``) per ``keys``."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    table = pq.read_table(events, columns=sorted({*keys, "kind", "duration_ns"}))
    if kind is not None:
        table = table.filter(pc.equal(table.column("kind").cast(pa.string()), kind))
    plain = pa.table({name: (table.column(name).cast(pa.string()) if pa.types.is_dictionary(table.column(name).type)
                             else table.column(name)) for name in [*keys, "duration_ns"]})
    grouped = plain.group_by(keys).aggregate(
        [("duration_ns", "count"), ("duration_ns", "min"), ("duration_ns", "mean"), ("duration_ns", "max"),
         ("duration_ns", "sum")]
    ).sort_by([(key, "ascending") for key in keys])
    pacsv.write_csv(grouped, path)
