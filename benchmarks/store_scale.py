"""The bundle store at fleet scale: a synthetic store (generated here, not committed) of
many bundles — 1,000 bundles / 100M dispatch events by default, 10 models of 39 call
sites each, half the runs labelled ``base`` and half ``cand`` — then ``top-sites`` and
``regressions`` timed on DuckDB (2 threads) and on Spark ``local[2]``, each as shipped
(reading the rollup ``op_totals``) and with the rollup computed from every event (the
raw scan), each in a fresh process so its peak resident memory (the process and its
children: Spark's JVM) is its own. Reports the store's bytes per event.

SYNTHETIC data, shaped like real runs: every bundle is written by ``dfit collect``'s own
bundle writer (``dfit_mlir.store.collect.bundle_writer``: the store's schemas, layout,
rollups and atomic placement).
The result replaces this benchmark's section of ``benchmarks/RESULTS.md``.

    python benchmarks/store_scale.py [--bundles 1000] [--events 100000000] [--spark-raw-events N]
                                     [--workdir DIR: keep the stores there, reuse them next time]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.compile_overhead import command_line, publish  # noqa: E402

BEGIN = "<!-- store_scale:begin -->"
END = "<!-- store_scale:end -->"
TARGET_S = 5.0
MODELS = 10
SITES = 39


def generate(store: Path, bundles: int, events: int, seed: int = 0) -> float:
    """Write the synthetic store through ``dfit collect``'s own bundle writer (its tables,
    its rollups, its atomic placement); returns seconds taken."""
    import pyarrow as pa

    from dfit_mlir import event_schema as es
    from dfit_mlir.store import layout
    from dfit_mlir.store.collect import bundle_writer, events_writer, open_store, write_table

    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    open_store(store, create=True)
    schema = layout.arrow_schema("events")
    per_bundle = events // bundles
    base_ns = rng.lognormal(10, 1.0, size=(MODELS, SITES)).astype(np.int64) + 1000
    for index in range(bundles):
        model = index % MODELS
        label = "base" if (index // MODELS) % 2 == 0 else "cand"
        run = f"r{index:06d}"
        ids = [f"m{model}/op#{site}" for site in range(SITES)]
        site = np.arange(per_bundle, dtype=np.int32) % SITES
        scale = base_ns[model][site] * (1.2 if label == "cand" and model == 0 else 1.0)
        duration = (scale * rng.lognormal(0, 0.05, per_bundle)).astype(np.int64)
        start = np.cumsum(duration + 200)
        columns = {
            es.SESSION: pa.DictionaryArray.from_arrays(pa.array(np.zeros(per_bundle, np.int32)), pa.array([run])),
            es.STAGE: pa.DictionaryArray.from_arrays(pa.array(np.zeros(per_bundle, np.int32)), pa.array(["runtime"])),
            es.KIND: pa.DictionaryArray.from_arrays(pa.array(np.zeros(per_bundle, np.int32)), pa.array(["dispatch"])),
            es.INVOCATION: pa.array((np.arange(per_bundle) // SITES).astype(np.int32)),
            es.SITE: pa.array(site),
            es.ROOT_ID: pa.DictionaryArray.from_arrays(pa.array(site), pa.array(ids)),
            es.PARTITION: pa.DictionaryArray.from_arrays(pa.array(site), pa.array([f"dispatch_{s}" for s in range(SITES)])),
            es.START_NS: pa.array(start), es.DURATION_NS: pa.array(duration),
        }
        arrays = [columns.get(field.name, pa.nulls(per_bundle, field.type)) for field in schema]
        small = {
            "sites": [{"site": s, "function": "main", "partition": f"dispatch_{s}", "root_id": ids[s], "ids": [ids[s]]}
                      for s in range(SITES)],
            "operators": [{"id": ids[s], "op": "linalg.generic", "source_file": f"model{model}.py",
                           "source_line": 10 + s} for s in range(SITES)],
            "partitions": [{"name": f"dispatch_{s}", "kind": "dispatch", "root_id": ids[s], "operators": 1,
                            "operator_ids": [ids[s]]} for s in range(SITES)],
            "coverage": [{"aspect": "per_op_timing", "status": "exposed"}],
            "runs": [{"kind": "run", "mode": "full", "label": label, "events": per_bundle,
                      "event_schema": es.SCHEMA_VERSION}],
        }
        with bundle_writer(store, "iree", f"model{model}", run) as tmp:
            with events_writer(tmp / "events.parquet") as writer:
                writer.write_table(pa.Table.from_arrays(arrays, schema=schema))
            for table, rows in small.items():
                write_table(tmp / f"{table}.parquet", table, rows)
        if index % 100 == 99:
            print(f"  generated {index + 1} bundles ({(index + 1) * per_bundle:,} events), "
                  f"{time.perf_counter() - started:.0f} s", flush=True)
    return time.perf_counter() - started


def prepared(workdir: Path | None, scratch: Path, bundles: int, events: int) -> tuple[Path, float | None]:
    """The store of ``bundles`` × ``events``: under ``workdir`` it is kept and reused by
    later runs (a stamp beside it says it was generated whole, with this layout); else
    generated in ``scratch``. Returns (store, seconds generating it; None: reused)."""
    from dfit_mlir.store import layout

    if workdir is None:
        store = scratch / f"store-{bundles}x{events}"
        return store, generate(store, bundles, events)
    store = workdir / f"store-{bundles}x{events}"
    stamp = workdir / f"store-{bundles}x{events}.json"
    expected = {"bundles": bundles, "events": events, "layout": layout.STORE_VERSION}
    if stamp.is_file() and store.is_dir() and json.loads(stamp.read_text()) == expected:
        print(f"reusing {store} ({stamp.name})", flush=True)
        return store, None
    if store.exists():
        raise SystemExit(f"{store}: exists but was not generated whole by this benchmark with layout "
                         f"{layout.STORE_VERSION} (no matching {stamp.name}); remove it")
    workdir.mkdir(parents=True, exist_ok=True)
    seconds = generate(store, bundles, events)
    stamp.write_text(json.dumps(expected))
    return store, seconds


#: (report, reads the rollup op_totals): the named reports as shipped, then the same
#: SQL with op_totals computed from every event (the raw ``events`` scan ad-hoc SQL pays).
CASES = (("top-sites", True), ("regressions", True), ("top-sites", False), ("regressions", False))


def measure(store: Path, engine: str, report: str, use_rollups: bool) -> dict[str, float]:
    """Run one report twice in a fresh process: ``start_s`` (import, engine start: Spark's
    JVM), ``first_s`` (the first query, with setting up its views: reading the footers
    of the files it names), ``again_s`` (the same query again, views set up), and the
    peak resident memory (VmHWM) of that process and, for Spark, of its JVM."""
    code = f"""
import json, time, sys
sys.path.insert(0, {str(REPO)!r})
t0 = time.perf_counter()
from dfit_mlir.store import engines, reports

def hwm(pid):
    for line in open(f"/proc/{{pid}}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0

if {engine!r} == "duckdb":
    engine = engines.DuckDBEngine({str(store)!r}, threads=2, use_rollups={use_rollups!r})
else:
    engine = engines.SparkEngine({str(store)!r}, use_rollups={use_rollups!r})
t1 = time.perf_counter()
sql = reports.get({report!r}).render(engine.dialect, {{"baseline": "base", "candidate": "cand"}}
                                    if {report!r} == "regressions" else {{}})
table = engine.sql(sql)
t2 = time.perf_counter()
again = engine.sql(sql)
t3 = time.perf_counter()
assert again.num_rows == table.num_rows
peak = hwm("self")
if {engine!r} == "spark":
    peak = max(peak, hwm(engine.session.sparkContext._gateway.proc.pid))
print(json.dumps({{"start_s": t1 - t0, "first_s": t2 - t1, "again_s": t3 - t2, "rows": table.num_rows,
                  "peak_mib": peak}}))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"{engine} {report}: failed\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundles", type=int, default=1000)
    parser.add_argument("--events", type=int, default=100_000_000)
    parser.add_argument("--spark-raw-events", type=int, default=5_000_000,
                        help="events of a separate, smaller store for Spark's raw-events runs (0: the same store)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep the generated stores here and reuse them in later runs (default: a temp dir)")
    args = parser.parse_args(argv)
    command = command_line(__file__, argv)
    started = dt.datetime.now(dt.timezone.utc)
    from dfit_mlir.store import layout

    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        store, generated_s = prepared(args.workdir, Path(tmp), args.bundles, args.events)
        size = sum(p.stat().st_size for p in store.rglob("*.parquet"))
        raw_size = sum(p.stat().st_size for p in store.rglob("events.parquet"))
        rollup_size = sum(p.stat().st_size for p in store.rglob("op_totals.parquet"))
        files = sum(1 for _ in store.rglob("*.parquet"))
        events = args.bundles * (args.events // args.bundles)
        print(f"store: {events:,} events in {args.bundles} bundles, {files} files, {size / 2**20:.0f} MiB "
              f"({size / events:.2f} bytes/event; events.parquet {raw_size / events:.2f})"
              + (f", generated in {generated_s:.0f} s" if generated_s is not None else ", reused"), flush=True)
        spark_raw, spark_raw_events = store, events
        if args.spark_raw_events:
            spark_raw, _ = prepared(args.workdir, Path(tmp), args.bundles, args.spark_raw_events)
            spark_raw_events = args.bundles * (args.spark_raw_events // args.bundles)
        results = {}
        for report, use_rollups in CASES:
            for engine in ("duckdb", "spark"):
                target, count = (spark_raw, spark_raw_events) if engine == "spark" and not use_rollups else \
                    (store, events)
                found = measure(target, engine, report, use_rollups)
                results[(report, use_rollups, engine)] = {**found, "events": count}
                print(f"{engine} {report} ({'op_totals' if use_rollups else 'raw events'}, {count:,} events): "
                      f"{found}", flush=True)
    lines = [
        BEGIN,
        "## Bundle store: top-sites and regressions at fleet scale (DuckDB vs Spark local)",
        "",
        f"Measured {started.strftime('%Y-%m-%d %H:%M UTC')} on this 2-core machine (shared with other jobs, timed "
        f"runs serialized by a lock); SYNTHETIC store (layout {layout.STORE_VERSION}, written by `dfit collect`'s "
        f"bundle writer) of {args.bundles:,} bundles, {events:,} dispatch events ({MODELS} models × {SITES} call "
        f"sites), {files:,} files, {size / 2**20:,.0f} MiB of Parquet: **{size / events:.2f} bytes per event** "
        f"(events.parquet {raw_size / events:.2f}, the op_totals rollup {rollup_size / 2**20:.1f} MiB in all)"
        + (f"; generated in {generated_s:.0f} s" if generated_s is not None else "") + ".",
        "",
        "The named reports read the rollup table `op_totals` (per bundle and root op: timed events, total, min, "
        "max, sum of squares, written by `dfit collect`); the rows marked *raw events* run the same report SQL "
        "with `op_totals` computed from every event instead (`use_rollups=False`: what a store written by "
        "layout 1.0, or ad-hoc SQL over `events`, pays). DuckDB with 2 threads; Spark `local[2]`"
        + (f"; Spark's raw-events rows over a separate store of {spark_raw_events:,} events (same shape)"
           if spark_raw != store else "")
        + ". Each report in a fresh process: *start* = import and engine start (Spark: its JVM), *first* = the "
          "first query including its views' set-up (reading the footers of the files it names), *again* = the "
          "same query once more in that process; peak = largest resident set (VmHWM) of the Python process or, "
          "for Spark, of its JVM. Command:",
        "",
        "```",
        command,
        "```",
        "",
        "| report | reads | engine | events | start (s) | first (s) | again (s) | rows | peak RSS (MiB) | ≤ 5 s |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|:-:|",
    ]
    for (report, use_rollups, engine), found in results.items():
        target = ("yes" if found["first_s"] <= TARGET_S else "**no**") if engine == "duckdb" else ""
        lines.append(f"| {report} | {'op_totals' if use_rollups else 'raw events'} | {engine} | {found['events']:,} | "
                     f"{found['start_s']:.1f} | {found['first_s']:.2f} | {found['again_s']:.2f} | {found['rows']} | "
                     f"{found['peak_mib']:.0f} | {target} |")
    lines.append("")
    for report, use_rollups in CASES:
        duck, spark = results[(report, use_rollups, "duckdb")], results[(report, use_rollups, "spark")]
        ratio = (spark["first_s"] / spark["events"]) / (duck["first_s"] / duck["events"])
        lines.append(f"- {report} ({'op_totals' if use_rollups else 'raw events'}): Spark local / DuckDB = "
                     f"{ratio:.1f}× per event, first query ({spark['first_s']:.2f} s for {spark['events']:,} vs "
                     f"{duck['first_s']:.2f} s for {duck['events']:,}).")
    publish(lines, begin=BEGIN, end=END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
