"""Throughput and memory of the normalized event pipeline: synthetic dispatch records
(written by this script, shaped like a squeezenet run: the manifest's call sites in a
loop) normalized and streamed to ``events.parquet``, at 1M and 4M events, next to the
same pipeline with a sink that discards (normalization alone).

Memory must not grow with the event count: the pipeline holds one batch at a time.
The Perfetto writer (``trace.pftrace``, encoded column-wise) streams from ``events.parquet``
the same way; its rate and peak are measured on the same files, next to the Parquet rate.
The result replaces this benchmark's section of ``benchmarks/RESULTS.md``.

    python benchmarks/event_pipeline.py [--manifest M]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.compile_overhead import command_line, publish  # noqa: E402
from dfit_mlir.core.event_pipeline import EventPipeline, ParquetSink, Policy  # noqa: E402
from dfit_mlir.exporters import chrome, perfetto  # noqa: E402

BEGIN = "<!-- event_pipeline:begin -->"
END = "<!-- event_pipeline:end -->"
BLOCK = 100_000
TARGET_EVENTS_PER_S = 1_000_000
#: Timed runs per rate (the median is reported): the machine's speed drifts between runs.
ROUNDS = 3


class DiscardSink:
    def export(self, batch: Any) -> None:
        pass

    def shutdown(self) -> None:
        pass


def run(manifest: dict[str, Any], total: int, sink: Any, *, traced: bool = False) -> tuple[float, float | None]:
    """(events per second, peak traced MiB or None) for ``total`` events. Tracing
    allocations slows Python 2-3x, so rates come from untraced runs."""
    sites = len(manifest["partitions"]["dispatch_sites"])
    if traced:
        tracemalloc.start()
    pipeline = EventPipeline(manifest, Policy(), sink, session="bench")
    started = time.perf_counter()
    for first in range(0, total, BLOCK):
        index = np.arange(first, min(total, first + BLOCK))
        pipeline.add_dispatches((index % sites).astype(np.int32), index * 1000, np.full(len(index), 500, np.int64),
                                np.full(len(index), 4, np.int64), np.full(len(index), 4, np.int64),
                                (index // sites).astype(np.int32))
    pipeline.close()
    elapsed = time.perf_counter() - started
    if not traced:
        return total / elapsed, None
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return total / elapsed, peak / 2**20


def trace_export(manifest: dict[str, Any], parquet: Path, out: Path, *, traced: bool = False) -> tuple[float, float]:
    """(events per second written to trace.pftrace, peak traced MiB or 0). Perfetto's
    protos are imported before (``main``), as pyarrow is before the Parquet runs."""
    if traced:
        tracemalloc.start()
    started = time.perf_counter()
    written = perfetto.write_perfetto(parquet, manifest, out)
    elapsed = time.perf_counter() - started
    peak = 0.0
    if traced:
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    return written / elapsed, peak


def chrome_export(manifest: dict[str, Any], parquet: Path, out: Path) -> float:
    """Events per second written to trace.json (one run: it is the slower writer)."""
    started = time.perf_counter()
    written = chrome.write_chrome_json(parquet, manifest, out)
    return written / (time.perf_counter() - started)


def default_manifest(workdir: Path) -> dict[str, Any]:
    from dfit_mlir.passes.instrumented_compile import compile_instrumented
    from tests import realmodels

    source = realmodels.onnx_model("squeezenet", REPO / "build" / "models")
    return compile_instrumented(source, workdir / "squeezenet.vmfb", mode="ids").manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifest", type=Path, default=None, help="default: compile squeezenet (ids mode)")
    args = parser.parse_args(argv)
    import perfetto.protos.perfetto.trace.perfetto_trace_pb2  # noqa: F401  (import cost kept out of the rates)

    command = command_line(__file__, argv)
    load = os.getloadavg()[0]
    started = dt.datetime.now(dt.timezone.utc)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        manifest = json.loads(args.manifest.read_text()) if args.manifest else default_manifest(workdir)
        rows = []
        trace_rows = []
        for total in (1_000_000, 4_000_000):
            discard_rate = statistics.median(run(manifest, total, DiscardSink())[0] for _ in range(ROUNDS))
            parquet = workdir / "events.parquet"
            rate = statistics.median(run(manifest, total, ParquetSink(parquet))[0] for _ in range(ROUNDS))
            _, peak = run(manifest, total, ParquetSink(parquet), traced=True)
            rows.append((total, discard_rate, rate, peak, parquet.stat().st_size / 2**20))
            print(f"{total:>9,} events: normalize {discard_rate:,.0f}/s, normalize+parquet {rate:,.0f}/s, "
                  f"peak {peak:.1f} MiB", flush=True)
            trace_rate = statistics.median(trace_export(manifest, parquet, workdir / "trace.pftrace")[0]
                                           for _ in range(ROUNDS))
            _, trace_peak = trace_export(manifest, parquet, workdir / "trace.pftrace", traced=True)
            json_rate = chrome_export(manifest, parquet, workdir / "trace.json")
            trace_rows.append((total, rate, trace_rate, trace_peak, (workdir / "trace.pftrace").stat().st_size / 2**20,
                               json_rate, (workdir / "trace.json").stat().st_size / 2**20))
            print(f"{total:>9,} events: perfetto trace {trace_rate:,.0f}/s, peak {trace_peak:.1f} MiB; "
                  f"chrome json {json_rate:,.0f}/s", flush=True)
    lines = [
        BEGIN,
        "## Event pipeline: synthetic dispatch records → events.parquet",
        "",
        f"Measured {started.strftime('%Y-%m-%d %H:%M UTC')} (load average {load:.1f} at the start); squeezenet's "
        f"{len(manifest['partitions']['dispatch_sites'])} call sites in a loop; blocks of {BLOCK:,} records; "
        f"rates are medians of {ROUNDS} untraced runs; peak = Python allocations traced (tracemalloc) in a separate run of the same size. Command:",
        "",
        "```",
        command,
        "```",
        "",
        "| events | normalize only (events/s) | normalize + Parquet (events/s) | peak (MiB) | file (MiB) | ≥ 1M/s |",
        "|---:|---:|---:|---:|---:|:-:|",
    ]
    for total, discard_rate, rate, peak, size in rows:
        lines.append(f"| {total:,} | {discard_rate:,.0f} | {rate:,.0f} | {peak:.1f} | {size:.1f} | "
                     f"{'yes' if rate >= TARGET_EVENTS_PER_S else '**no**'} |")
    lines += [
        "",
        "Trace export (`trace.pftrace` streamed from the same `events.parquet`; TracePacket/TrackEvent wire format "
        "encoded column-wise, one slice per event), next to the Parquet rate:",
        "",
        "| events | normalize + Parquet (events/s) | Perfetto trace (events/s) | trace peak (MiB) | trace (MiB) | "
        "trace ≥ 1M/s | Chrome JSON (events/s, one run) | JSON (MiB) |",
        "|---:|---:|---:|---:|---:|:-:|---:|---:|",
    ]
    for total, parquet_rate, rate, peak, size, json_rate, json_size in trace_rows:
        lines.append(f"| {total:,} | {parquet_rate:,.0f} | {rate:,.0f} | {peak:.1f} | {size:.1f} | "
                     f"{'yes' if rate >= TARGET_EVENTS_PER_S else '**no**'} | {json_rate:,.0f} | {json_size:.1f} |")
    lines += [
        "",
        "`trace.json` (Chrome trace JSON, written next to `trace.pftrace` in every run bundle) is encoded column-wise "
        "too; it has no interning, so every event repeats its slice's arguments (~4x the bytes of the pftrace).",
    ]
    publish(lines, begin=BEGIN, end=END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
