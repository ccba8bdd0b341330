"""The bundle store at fleet scale: a synthetic store (generated here, not committed) of
many bundles — 1,000 bundles / 100M dispatch events by default, 10 models of 39 call
sites each, half the runs labelled ``base`` and half ``cand`` — then ``top-sites`` and
``regressions`` timed on DuckDB (2 threads) and on Spark ``local[2]``, each query in a
fresh process so its peak resident memory (the process and its children: Spark's JVM)
is its own. Reports the store's bytes per event.

SYNTHETIC data, shaped like real runs: every bundle is written with the store's own
schemas (``dfit_mlir.store.layout``) and layout, like ``dfit collect`` writes it.
The result replaces this benchmark's section of ``benchmarks/RESULTS.md``.

    python benchmarks/store_scale.py [--bundles 1000] [--events 100000000] [--spark-events N]
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
    """Write the synthetic store; returns seconds taken."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dfit_mlir import event_schema as es
    from dfit_mlir.store import layout

    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    store.mkdir(parents=True)
    (store / layout.META_FILE).write_text(json.dumps({"schema": layout.STORE_SCHEMA, "version": layout.STORE_VERSION,
                                                      "event_schema": es.SCHEMA_VERSION}))
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
        target = layout.bundle_dir(store, "iree", f"model{model}", run)
        target.mkdir(parents=True)
        pq.write_table(pa.Table.from_arrays(arrays, schema=schema), target / "events.parquet", compression="zstd",
                       row_group_size=1 << 20)
        small = {
            "sites": {"site": list(range(SITES)), "function": ["main"] * SITES,
                      "partition": [f"dispatch_{s}" for s in range(SITES)], "root_id": ids, "ids": [[i] for i in ids]},
            "operators": {"id": ids, "op": ["linalg.generic"] * SITES, "source_file": [f"model{model}.py"] * SITES,
                          "source_line": list(range(10, 10 + SITES))},
            "partitions": {"name": [f"dispatch_{s}" for s in range(SITES)]},
            "coverage": {"aspect": ["per_op_timing"], "status": ["exposed"]},
            "runs": {"kind": ["run"], "mode": ["full"], "label": [label], "events": [per_bundle]},
        }
        for table, values in small.items():
            table_schema = layout.arrow_schema(table)
            count = len(next(iter(values.values())))
            arrays = [pa.array(values[f.name], f.type) if f.name in values else pa.nulls(count, f.type)
                      for f in table_schema]
            pq.write_table(pa.Table.from_arrays(arrays, schema=table_schema), target / f"{table}.parquet")
        if index % 100 == 99:
            print(f"  generated {index + 1} bundles ({(index + 1) * per_bundle:,} events), "
                  f"{time.perf_counter() - started:.0f} s", flush=True)
    return time.perf_counter() - started


def measure(store: Path, engine: str, report: str) -> dict[str, float]:
    """Run one report in a fresh process: wall seconds of the query (engine set up
    excluded, reported apart) and the peak resident memory (VmHWM) of that process and,
    for Spark, of its JVM."""
    code = f"""
import json, time, sys
sys.path.insert(0, {str(REPO)!r})
from dfit_mlir.store import engines, reports

def hwm(pid):
    for line in open(f"/proc/{{pid}}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0

t0 = time.perf_counter()
engine = engines.DuckDBEngine({str(store)!r}, threads=2) if {engine!r} == "duckdb" else engines.SparkEngine({str(store)!r})
t1 = time.perf_counter()
sql = reports.get({report!r}).render(engine.dialect, {{"baseline": "base", "candidate": "cand"}}
                                    if {report!r} == "regressions" else {{}})
table = engine.sql(sql)
t2 = time.perf_counter()
peak = hwm("self")
if {engine!r} == "spark":
    peak = max(peak, hwm(engine.session.sparkContext._gateway.proc.pid))
print(json.dumps({{"setup_s": t1 - t0, "query_s": t2 - t1, "rows": table.num_rows, "peak_mib": peak}}))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundles", type=int, default=1000)
    parser.add_argument("--events", type=int, default=100_000_000)
    parser.add_argument("--spark-events", type=int, default=None,
                        help="events of a separate, smaller store for Spark (default: the same store)")
    parser.add_argument("--workdir", type=Path, default=None, help="where the store is generated (default: a temp dir)")
    args = parser.parse_args(argv)
    command = command_line(__file__, argv)
    started = dt.datetime.now(dt.timezone.utc)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        store = Path(tmp) / "store"
        generated_s = generate(store, args.bundles, args.events)
        size = sum(p.stat().st_size for p in store.rglob("*.parquet"))
        events = args.bundles * (args.events // args.bundles)
        print(f"store: {events:,} events in {args.bundles} bundles, {size / 2**20:.0f} MiB "
              f"({size / events:.2f} bytes/event), generated in {generated_s:.0f} s", flush=True)
        spark_store, spark_events = store, events
        if args.spark_events:
            spark_store = Path(tmp) / "spark-store"
            generate(spark_store, args.bundles, args.spark_events)
            spark_events = args.bundles * (args.spark_events // args.bundles)
        results = {}
        for report in ("top-sites", "regressions"):
            results[("duckdb", report)] = measure(store, "duckdb", report)
            print(f"duckdb {report}: {results[('duckdb', report)]}", flush=True)
            results[("spark", report)] = measure(spark_store, "spark", report)
            print(f"spark {report}: {results[('spark', report)]}", flush=True)
    lines = [
        BEGIN,
        "## Bundle store: top-sites and regressions at fleet scale (DuckDB vs Spark local)",
        "",
        f"Measured {started.strftime('%Y-%m-%d %H:%M UTC')} on this 2-core machine (shared with other jobs); "
        f"SYNTHETIC store of {args.bundles:,} bundles, {events:,} dispatch events ({MODELS} models × {SITES} call "
        f"sites), {size / 2**20:,.0f} MiB of Parquet: **{size / events:.2f} bytes per event**; generated in "
        f"{generated_s:.0f} s. DuckDB with 2 threads; Spark `local[2]`"
        + (f" over a separate store of {spark_events:,} events (same shape)" if spark_store != store else
           " over the same store")
        + ". Each query in a fresh process; query time excludes engine setup (given apart); peak = largest "
          "resident set (VmHWM) of the Python process or, for Spark, of its JVM. Command:",
        "",
        "```",
        command,
        "```",
        "",
        "| report | engine | events | setup (s) | query (s) | rows | peak RSS (MiB) | DuckDB ≤ 5 s |",
        "|---|---|---:|---:|---:|---:|---:|:-:|",
    ]
    for (engine, report), found in results.items():
        count = events if engine == "duckdb" else spark_events
        target = ("yes" if found["query_s"] <= TARGET_S else "**no**") if engine == "duckdb" else ""
        lines.append(f"| {report} | {engine} | {count:,} | {found['setup_s']:.1f} | {found['query_s']:.2f} | "
                     f"{found['rows']} | {found['peak_mib']:.0f} | {target} |")
    lines.append("")
    for report in ("top-sites", "regressions"):
        duck, spark = results[("duckdb", report)], results[("spark", report)]
        per_event = (spark["query_s"] / spark_events) / (duck["query_s"] / events)
        lines.append(f"- {report}: Spark local / DuckDB = {per_event:.1f}× per event "
                     f"({spark['query_s']:.2f} s for {spark_events:,} vs {duck['query_s']:.2f} s for {events:,}).")
    publish(lines, begin=BEGIN, end=END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
