"""The bundle store at fleet scale: a synthetic store (generated here, not committed) of
many bundles — 1,000 bundles / 100M dispatch events by default, 10 models of 39 call
sites each, half the runs labelled ``base`` and half ``cand`` — then ``top-sites`` and
``regressions`` timed on DuckDB (2 threads) and on Spark ``local[2]``, each as shipped
(reading the rollup ``op_totals``) and with the rollup computed from every event (the
raw scan), each in a fresh process so its peak resident memory (the process and its
children: Spark's JVM) is its own. Reports the store's bytes per event.

SYNTHETIC data, shaped like real runs: every bundle is written by ``dfit collect``'s own
bundle writer (``dfit_mlir.fleet.store.collect.bundle_writer``: the store's schemas, layout,
rollups and atomic placement).
The result replaces this benchmark's section of ``benchmarks/RESULTS.md``.

    python benchmarks/store_scale.py [--bundles 1000] [--events 100000000] [--spark-raw-events N]
                                     [--workdir DIR: keep the stores there, reuse them next time]
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

    from dfit_mlir.core import event_schema as es
    from dfit_mlir.fleet.store import layout
    from dfit_mlir.fleet.store.collect import bundle_writer, events_writer, open_store, write_table

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
            # One op per dispatch (SYNTHETIC): the ledger gives it its dispatch's whole time.
            "op_ledger": [{"partition": f"dispatch_{s}", "site": s, "op_id": ids[s], "op": "linalg.generic",
                           "role": "root", "source_file": f"model{model}.py", "source_line": 10 + s,
                           "share": 1.0, "calls": int((site == s).sum()), "time_ns": int(duration[site == s].sum()),
                           "time_model": "roofline(ridge 4 MAC/B)",
                           "run_instances": int(per_bundle // SITES + (per_bundle % SITES > 0))}
                          for s in range(SITES)],
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


def prepared(workdir: Path | None, scratch: Path, bundles: int, events: int,
             compacted: bool = False) -> tuple[Path, dict[str, float] | None]:
    """The store of ``bundles`` × ``events`` as ``dfit collect`` writes it, or (``compacted``)
    a copy of it compacted by ``dfit store compact``. Under ``workdir`` it is kept and
    reused by later runs (a stamp beside it says it was made whole, with this layout);
    else made in ``scratch``. Returns (store, {seconds, peak MiB} making it; None: reused)."""
    from dfit_mlir.fleet.store import layout

    root = workdir if workdir is not None else scratch
    name = f"store-{bundles}x{events}" + ("-compacted" if compacted else "")
    store, stamp = root / name, root / f"{name}.json"
    expected = {"bundles": bundles, "events": events, "layout": layout.STORE_VERSION, "compacted": compacted}
    found = json.loads(stamp.read_text()) if stamp.is_file() else {}
    if store.is_dir() and {key: found.get(key) for key in expected} == expected:
        print(f"reusing {store} ({stamp.name})", flush=True)
        return store, {**found.get("made", {}), "reused": True} if found.get("made") else None
    if store.exists():
        raise SystemExit(f"{store}: exists but was not made whole by this benchmark with layout "
                         f"{layout.STORE_VERSION} (no matching {stamp.name}); remove it")
    root.mkdir(parents=True, exist_ok=True)
    if not compacted:
        made = {"seconds": generate(store, bundles, events)}
    else:
        source, _ = prepared(workdir, scratch, bundles, events)
        shutil.copytree(source, store)
        made = _timed_compaction(store)
        print(f"compacted {store}: {made}", flush=True)
    stamp.write_text(json.dumps({**expected, "made": made}))
    return store, made


def _timed_compaction(store: Path) -> dict[str, float]:
    """``dfit store compact`` in a fresh process: its seconds and peak resident memory."""
    code = f"""
import json, resource, sys, time
sys.path.insert(0, {str(REPO)!r})
from pathlib import Path
from dfit_mlir.fleet.store.compact import compact
t0 = time.perf_counter()
done = compact(Path({str(store)!r}))
print(json.dumps({{"seconds": time.perf_counter() - t0, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "parts": done.parts, "runs": done.runs}}))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


#: (report, store, reads the rollup op_totals, engines): the named reports as shipped on
#: the store as collected and compacted, then the same SQL with op_totals computed from
#: every event (the raw ``events`` scan that ad-hoc SQL, or a store of layout 1.0, pays;
#: on Spark over the smaller ``raw`` store).
CASES = (
    ("top-sites", "compacted", True, ("duckdb", "spark")),
    ("regressions", "compacted", True, ("duckdb", "spark")),
    ("top-sites", "collected", True, ("duckdb", "spark")),
    ("regressions", "collected", True, ("duckdb",)),
    ("top-sites", "collected", False, ("duckdb",)),
    ("top-sites", "raw", False, ("spark",)),
    ("regressions", "collected", False, ("duckdb",)),
)


def measure(store: Path, engine: str, report: str, use_rollups: bool) -> dict[str, float]:
    """Run one report twice in a fresh process: ``start_s`` (import, engine start: Spark's
    JVM), ``first_s`` (the first query, with setting up its views: reading the footers
    of the files it names), ``again_s`` (the same query again, views set up), and the
    peak resident memory (VmHWM) of that process and, for Spark, of its JVM."""
    code = f"""
import json, time, sys
sys.path.insert(0, {str(REPO)!r})
t0 = time.perf_counter()
from dfit_mlir.fleet.store import engines, reports

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
                        help="events of the smaller store Spark scans every event of (0: the same store)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep the generated stores here and reuse them in later runs (default: a temp dir)")
    args = parser.parse_args(argv)
    command = command_line(__file__, argv)
    started = dt.datetime.now(dt.timezone.utc)
    load_before = os.getloadavg()[0]
    from dfit_mlir.fleet.store import layout
    from dfit_mlir.fleet.store.compact import SMALL_BUNDLE_EVENTS

    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        events = args.bundles * (args.events // args.bundles)
        collected, generated = prepared(args.workdir, Path(tmp), args.bundles, args.events)
        compacted, compaction = prepared(args.workdir, Path(tmp), args.bundles, args.events, compacted=True)
        stores = {"collected": (collected, events), "compacted": (compacted, events)}
        if args.spark_raw_events:
            raw, _ = prepared(args.workdir, Path(tmp), args.bundles, args.spark_raw_events)
            stores["raw"] = (raw, args.bundles * (args.spark_raw_events // args.bundles))
        else:
            stores["raw"] = stores["collected"]
        shape = {}
        for variant in ("collected", "compacted"):
            path = stores[variant][0]
            parquet = sorted(path.rglob("*.parquet"))
            shape[variant] = {"files": len(parquet), "bytes": sum(p.stat().st_size for p in parquet),
                              "events_bytes": sum(p.stat().st_size for p in parquet if p.name == "events.parquet"
                                                  or "/compacted/events/" in str(p)),
                              "rollup_bytes": sum(p.stat().st_size for p in parquet if p.name == "op_totals.parquet"
                                                  or "/compacted/op_totals/" in str(p))}
            print(f"{variant}: {events:,} events in {args.bundles} bundles: {shape[variant]}", flush=True)
        results = []
        for report, variant, use_rollups, engine_names in CASES:
            path, count = stores[variant]
            for engine in engine_names:
                found = measure(path, engine, report, use_rollups)
                results.append({**found, "report": report, "variant": variant, "rollups": use_rollups,
                                "engine": engine, "events": count})
                print(f"{engine} {report} on {variant} ({'op_totals' if use_rollups else 'raw events'}, "
                      f"{count:,} events): {found}", flush=True)
    load_after = os.getloadavg()[0]
    collected_shape, compacted_shape = shape["collected"], shape["compacted"]
    made = ("reused from an earlier run" if not generated else
            f"generated in {generated['seconds']:.0f} s" + (" by an earlier run" if generated.get("reused") else ""))
    compacted_how = ("compacted in an earlier run" if not compaction else
                     f"`dfit store compact` took {compaction['seconds']:.0f} s, peak RSS {compaction['peak_mib']:.0f} "
                     "MiB" + (" in an earlier run" if compaction.get("reused") else ""))
    lines = [
        BEGIN,
        "## Bundle store: top-sites and regressions at fleet scale (DuckDB vs Spark local)",
        "",
        f"Measured {started.strftime('%Y-%m-%d %H:%M UTC')} on this 2-core machine (shared with other jobs; timed "
        f"runs serialized by a lock; 1-minute load average {load_before:.1f} at the start, {load_after:.1f} at the "
        f"end). SYNTHETIC store, layout {layout.STORE_VERSION}, written by `dfit collect`'s own "
        f"bundle writer: {args.bundles:,} bundles, {events:,} dispatch events ({MODELS} models × {SITES} call sites), "
        f"{made}.",
        "",
        f"- *collected* (as `dfit collect` leaves it): {collected_shape['files']:,} files, "
        f"{collected_shape['bytes'] / 2**20:,.0f} MiB: **{collected_shape['bytes'] / events:.2f} bytes per event** "
        f"(events.parquet {collected_shape['events_bytes'] / events:.2f}; the op_totals rollup "
        f"{collected_shape['rollup_bytes'] / 2**20:.1f} MiB in all).",
        f"- *compacted* (the same store after `dfit store compact`; {compacted_how}): "
        f"{compacted_shape['files']:,} files, {compacted_shape['bytes'] / 2**20:,.0f} MiB, "
        f"{compacted_shape['bytes'] / events:.2f} bytes per event. "
        + (f"Its bundles' {events // args.bundles:,} events each stay in their events.parquet (compaction merges "
           f"the events of bundles under {SMALL_BUNDLE_EVENTS:,} only)" if events // args.bundles >= SMALL_BUNDLE_EVENTS
           else f"Its bundles' {events // args.bundles:,} events each are merged too (under {SMALL_BUNDLE_EVENTS:,})")
        + "; every other table, op_totals included, is in one part per table and model.",
        "",
        "`top-sites` and `regressions` read the rollup table **op_totals** (per bundle and root op: timed events, "
        "total, min, max, sum of squares; written by `dfit collect`). Rows marked *raw events* run the same report "
        "SQL with op_totals computed from every event instead (`use_rollups=False`: what ad-hoc SQL over `events`, "
        "or a store written by layout 1.0, pays)"
        + (f"; Spark's raw-events row is over a separate store of {stores['raw'][1]:,} events (same shape)"
           if stores["raw"] != stores["collected"] else "")
        + ". DuckDB with 2 threads; Spark `local[2]`. Each report in a fresh process: *start* = import and engine "
          "start (Spark: its JVM), *first* = the first query including its views' set-up (reading the footers of "
          "the files it names), *again* = the same query once more in that process; peak = largest resident set "
          "(VmHWM) of the Python process or, for Spark, of its JVM. The 5 s target applies to DuckDB's *first*. "
          "Command:",
        "",
        "```",
        command,
        "```",
        "",
        "| report | store | reads | engine | events | start (s) | first (s) | again (s) | rows | peak RSS (MiB) | ≤ 5 s |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|:-:|",
    ]
    for found in results:
        target = ("yes" if found["first_s"] <= TARGET_S else "**no**") if found["engine"] == "duckdb" else ""
        lines.append(f"| {found['report']} | {found['variant'] if found['variant'] != 'raw' else 'collected'} | "
                     f"{'op_totals' if found['rollups'] else 'raw events'} | {found['engine']} | "
                     f"{found['events']:,} | {found['start_s']:.1f} | {found['first_s']:.2f} | {found['again_s']:.2f} | "
                     f"{found['rows']} | {found['peak_mib']:.0f} | {target} |")
    lines.append("")
    by = {(r["report"], r["variant"] if r["variant"] != "raw" else "collected", r["rollups"], r["engine"]): r
          for r in results}
    for (report, variant, rollups, engine), spark in by.items():
        duck = by.get((report, variant, rollups, "duckdb"))
        if engine != "spark" or duck is None:
            continue
        ratio = (spark["first_s"] / spark["events"]) / (duck["first_s"] / duck["events"])
        lines.append(f"- {report} on the {variant} store ({'op_totals' if rollups else 'raw events'}): Spark local / "
                     f"DuckDB = {ratio:.1f}× per event, first query ({spark['first_s']:.2f} s for "
                     f"{spark['events']:,} events vs {duck['first_s']:.2f} s for {duck['events']:,}).")
    publish(lines, begin=BEGIN, end=END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
