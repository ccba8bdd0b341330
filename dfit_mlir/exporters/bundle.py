"""Writing a run bundle: one directory, written atomically (a temporary sibling renamed
into place; an existing bundle is replaced only once the new one is complete).

* ``manifest.json`` — the compile's manifest;
* ``events.parquet`` — normalized events (``dfit_mlir.core.event_schema``);
* ``sites.parquet`` — the interned IDs: every dispatch call site with its root and
  fused IDs (empty when the manifest has none);
* ``dispatches.csv`` — per call site: count and min/mean/max/total duration;
  ``events.csv`` — per kind and partition: count and durations;
* ``trace.pftrace`` (Perfetto native) and ``trace.json`` (Chrome trace JSON);
* ``summary.json`` — mode, policy, counts (dropped included), inputs, versions.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from dfit_mlir.core import atomic, toolchain
from dfit_mlir.core import manifest as manifest_io
from dfit_mlir.core.event_pipeline import EventPipeline, ParquetSink, site_table
from dfit_mlir.exporters import traces

SUMMARY_SCHEMA = "dfit.run-summary"
SUMMARY_VERSION = "1.1"
#: The output kind of a bundle directory (its marker; see dfit_mlir.core.outputs).
BUNDLE_KIND = "bundle"


def write_bundle(bundle: Path, manifest: dict[str, Any], fill: Callable[[ParquetSink], EventPipeline],
                 summary: dict[str, Any], extra_files: dict[str, str] | None = None) -> Path:
    """``fill(sink)`` returns a pipeline holding the run's events (not yet closed);
    ``extra_files``: more text files for the bundle (name → content)."""
    import pyarrow.parquet as pq

    with atomic.atomic_directory(bundle, kind=BUNDLE_KIND) as tmp:
        pipeline = fill(ParquetSink(tmp / "events.parquet"))
        counts = pipeline.close()
        manifest_io.save(manifest, tmp / "manifest.json")
        pq.write_table(site_table(manifest), tmp / "sites.parquet")
        events = tmp / "events.parquet"
        _grouped_csv(events, tmp / "dispatches.csv", kind="dispatch", keys=["site", "partition", "root_id"])
        _grouped_csv(events, tmp / "events.csv", kind=None, keys=["kind", "partition"])
        slices = traces.write_perfetto(events, manifest, tmp / "trace.pftrace")
        traces.write_chrome_json(events, manifest, tmp / "trace.json")
        document = {
            "schema": SUMMARY_SCHEMA,
            "version": SUMMARY_VERSION,
            "policy": asdict(pipeline.policy),
            "counts": asdict(counts),
            # Dropped at the budget in the pipeline, or earlier by an in-process session.
            "dropped_events": counts.dropped + summary.get("dropped_in_process", 0),
            "trace_slices": slices,
            **summary,
            "toolchain": toolchain.versions(),
        }
        (tmp / "summary.json").write_text(json.dumps(document, indent=1) + "\n")
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
    return bundle


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
