"""The bundle of a long run opens in bounded memory (issue 29): a bundle of N events is
built from a real ``dfit run --mode full`` of the demo convnet (its manifest, its
events: dispatch, queue and memory families), its events repeated with shifted times
and invocation numbers until there are N (synthetic events joined to a real manifest,
written window by window as a streamed run writes them), then ``dfit analyze``,
``dfit view`` and ``dfit collect`` are run on it, each a child process: wall, CPU
(user + system) and peak RSS (``ru_maxrss`` from ``os.wait4``), at two sizes side by
side. Building the bundle (``events.parquet``, then every other file of the bundle,
the traces included, by :func:`dfit_mlir.exporters.bundle.write_files`) is measured
the same way: it is the writers' half of ``dfit run``.

    .venv/bin/python -m benchmarks.big_bundle --events 1000000,5000000

The result replaces this benchmark's section of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BEGIN = "<!-- big_bundle:begin -->"
END = "<!-- big_bundle:end -->"
#: Invocations of the real run the events are repeated from (22 events each).
SEED_INVOCATIONS = 1000
#: The target the issue sets for every command on a long run's bundle.
TARGET_RSS_MIB = 300


def timed(command: list[str], cwd: Path | None = None) -> dict[str, Any]:
    """Wall seconds, CPU seconds and peak RSS (MiB) of ``command`` (long_runs' measure)."""
    from benchmarks.long_runs import timed as measured

    return measured(command, cwd, digits=2)


def seed_bundle(work: Path) -> Path:
    """A real bundle: the convnet compiled with ``--dfit-tag --mode full`` and run
    :data:`SEED_INVOCATIONS` times under HAL profiling."""
    import numpy as np

    dfit = str(Path(sys.executable).parent / "dfit")
    vmfb = work / "convnet.vmfb"
    subprocess.run([dfit, "compile", str(ROOT / "examples/models/convnet.mlir"), "-o", str(vmfb), "--dfit-tag",
                    "--mode", "full"], check=True, capture_output=True)
    np.save(work / "x.npy", np.random.default_rng(0).standard_normal((1, 32, 32, 3)).astype(np.float32))
    subprocess.run([dfit, "run", str(vmfb), "--mode", "full", "--repeat", str(SEED_INVOCATIONS), "--input",
                    f"@{work / 'x.npy'}", "-o", str(work / "seed")], check=True, capture_output=True)
    return work / "seed"


def build(seed: Path, out: Path, events: int, trace_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """``out``: the bundle of ``seed`` with its events repeated to ``events`` (each copy's
    times shifted past the previous copy's, its invocations numbered on), then every other
    file of a bundle written from them. Memory: one copy of the seed's events at a time."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from dfit_mlir.core import manifest as manifest_io
    from dfit_mlir.exporters.bundle import write_files

    table = pq.read_table(seed / "events.parquet")
    summary = json.loads((seed / "summary.json").read_text())
    starts = table.column("start_ns")
    span = pc.max(starts).as_py() - pc.min(starts).as_py() + 100_000  # the seed's run, plus a gap
    invocations = summary["repeat"]
    out.mkdir(parents=True)
    written = 0
    copy = 0
    with pq.ParquetWriter(out / "events.parquet", table.schema) as writer:
        while written < events:
            part = table.slice(0, min(table.num_rows, events - written))
            shifted = part.set_column(part.schema.get_field_index("start_ns"), "start_ns",
                                      pc.add(part.column("start_ns"), copy * span))
            shifted = shifted.set_column(shifted.schema.get_field_index("invocation"), "invocation",
                                         pc.add(shifted.column("invocation"),
                                                pa.scalar(copy * invocations, pa.int32())))
            writer.write_table(shifted, row_group_size=65_536)
            written += part.num_rows
            copy += 1
    head = {key: summary[key] for key in ("policy", "counts") if key in summary}
    head["counts"] = {**head.get("counts", {}), "seen": written, "kept": written}
    head["dropped_events"] = 0
    rest = {key: value for key, value in summary.items()
            if key not in {"schema", "version", "policy", "counts", "dropped_events", "trace_slices", "toolchain",
                           "trace"}}
    rest["repeat"] = copy * invocations
    document = write_files(out, manifest_io.load(seed / "manifest.json"), rest, head=head, **(trace_options or {}))
    return {"events": written, "invocations": copy * invocations, "trace": document.get("trace")}


def measure(seed: Path, work: Path, events: int) -> dict[str, Any]:
    """Build the bundle of ``events`` events (a child process), then run the three
    commands on it; each measured as :func:`timed` says."""
    python = sys.executable
    dfit = str(Path(python).parent / "dfit")
    bundle = work / f"bundle-{events}"
    row: dict[str, Any] = {"events": events}
    row["build"] = timed([python, "-m", "benchmarks.big_bundle", "--build", str(seed), str(bundle), str(events)],
                         cwd=ROOT)
    row["sizes_mb"] = {name: round((bundle / name).stat().st_size / 1e6, 1)
                       for name in ("events.parquet", "trace.pftrace", "trace.json")}
    summary = json.loads((bundle / "summary.json").read_text())
    row["trace"], row["invocations"] = summary.get("trace"), summary["repeat"]
    row["analyze"] = timed([dfit, "analyze", str(bundle), "--tool", "all", "--out", str(work / f"analysis-{events}")])
    row["view"] = timed([dfit, "view", str(bundle), "-o", str(work / f"view-{events}.html")])
    row["view_html_mb"] = round((work / f"view-{events}.html").stat().st_size / 1e6, 2)
    row["collect"] = timed([dfit, "collect", str(bundle), "-o", str(work / f"store-{events}")])
    shutil.rmtree(bundle)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", default="1000000,5000000", help="comma-separated sizes (default 1M and 5M)")
    parser.add_argument("--build", nargs=3, metavar=("SEED", "OUT", "EVENTS"), default=None,
                        help=argparse.SUPPRESS)  # the child that builds one bundle
    parser.add_argument("--no-publish", action="store_true", help="print the section, leave RESULTS.md alone")
    args = parser.parse_args(argv)
    if args.build:
        # The writers' half of `dfit run`: under the allocator the dfit command runs Arrow
        # on (set before anything imports Arrow).
        from dfit_mlir.__main__ import ARROW_MEMORY_POOL

        os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", ARROW_MEMORY_POOL)
        seed, out, events = args.build
        print(json.dumps(build(Path(seed), Path(out), int(events))))
        return 0
    from benchmarks.compile_overhead import command_line, publish

    command = command_line(__file__, argv).replace("python benchmarks/big_bundle.py", ".venv/bin/python -m "
                                                                                       "benchmarks.big_bundle")
    started = dt.datetime.now(dt.timezone.utc)
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="dfit-big-bundle-") as tmp:
        work = Path(tmp)
        seed = seed_bundle(work)
        for events in (int(text) for text in args.events.split(",")):
            row = measure(seed, work, events)
            rows.append(row)
            print(json.dumps(row), flush=True)
    load_after = os.getloadavg()

    def cell(measured: dict[str, Any]) -> str:
        return f"{measured['wall_s']} s / {measured['cpu_s']} s / {measured['rss_mib']} MiB"

    lines = [BEGIN, "## The bundle of a long run: `dfit analyze`, `dfit view`, `dfit collect` (issue 29)", "",
             f"    {command}", "",
             f"Measured {started.strftime('%Y-%m-%d %H:%M UTC')}; load average {load_before[0]:.1f} at the start, "
             f"{load_after[0]:.1f} at the end (a shared 2-core machine: compare CPU, not wall). The bundle: a real "
             f"`dfit run --mode full --repeat {SEED_INVOCATIONS}` of the demo convnet (22 events per invocation: "
             "dispatch, queue and memory), its events repeated with shifted times and invocations to N, the "
             "rest of the bundle (CSVs, traces, summary) written from them by `write_files`. Each cell: wall / "
             "CPU (user + system) / peak RSS of the command, a child process.", "",
             "| events | invocations | build (writers) | `dfit analyze` | `dfit view` | `dfit collect` | "
             "view.html | trace.pftrace | trace kept |",
             "|---:|---:|---|---|---|---|---:|---:|---|"]
    for row in rows:
        trace = row.get("trace") or {}
        kept = "all" if trace.get("kept") in (None, "all") else \
            f"first/last {trace.get('full_invocations_each_end')} in full, {trace.get('summarised_invocations')} " \
            "summarised"
        lines.append(f"| {row['events']:,} | {row['invocations']:,} | {cell(row['build'])} | {cell(row['analyze'])} | "
                     f"{cell(row['view'])} | {cell(row['collect'])} | {row['view_html_mb']} MB | "
                     f"{row['sizes_mb']['trace.pftrace']} MB | {kept} |")
    worst = max(row[name]["rss_mib"] for row in rows for name in ("build", "analyze", "view", "collect"))
    lines += ["", f"Largest peak RSS of any command: {worst} MiB (target ≤ {TARGET_RSS_MIB} MiB, flat in N)."]
    if args.no_publish:
        print("\n".join([*lines, "", END]))
    else:
        publish(lines, begin=BEGIN, end=END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
