"""What the read-only policy of ``dfit query`` costs (``dfit_mlir/fleet/store/policy.py``):
``top-sites`` over a real store, with the policy and without it (a plain DuckDB
connection, no check of the text: what dfit ran before), in the same process, the two
alternating round after round; plus the check alone (DuckDB: ``extract_statements`` of
the report's text; Spark with ``--spark``: Spark's parser and the plan walk).

The store: the convnet of ``examples/`` compiled by IREE (full mode) and run
``--runs`` times (real runs), collected by ``dfit collect``; or ``--store PATH``.
Each round opens a fresh engine (the connection set-up is where the policy's settings
are made) and runs the report once. The result replaces this benchmark's section of
``benchmarks/RESULTS.md``.

    python benchmarks/query_policy.py [--rounds 30] [--runs 4] [--store PATH] [--spark]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.compile_overhead import command_line, publish  # noqa: E402

BEGIN = "<!-- query_policy:begin -->"
END = "<!-- query_policy:end -->"


def real_store(root: Path, runs: int) -> Path:
    """The convnet compiled (full) and run ``runs`` times by IREE, collected."""
    from dfit_mlir.fleet.store import Placement, collect
    from dfit_mlir.passes.instrumented_compile import compile_instrumented
    from dfit_mlir.runtime_hooks.run import run_bundle

    compiled = compile_instrumented(REPO / "examples" / "models" / "convnet.mlir", root / "convnet.vmfb", mode="full")
    bundles = [run_bundle(compiled.vmfb, compiled.manifest_path, root / f"run{k}", mode="full", repeat=3,
                          warmup=1).bundle for k in range(runs)]
    store = root / "store"
    collect([*bundles, compiled.manifest_path], store, Placement(label="bench"))
    return store


@contextmanager
def without_policy() -> Any:
    """The engines as before the policy (the same stand-in the tests compare against)."""
    import duckdb

    from dfit_mlir.fleet.store import policy

    saved = policy.duckdb_connection, policy.check_duckdb

    def plain(location: str, limits: Any, prelude: tuple[str, ...] = ()) -> Any:
        connection = duckdb.connect(config={"threads": limits.threads})
        connection.execute("SET parquet_metadata_cache = true")
        for statement in prelude:
            connection.execute(statement)
        return connection

    policy.duckdb_connection, policy.check_duckdb = plain, lambda text: None
    try:
        yield
    finally:
        policy.duckdb_connection, policy.check_duckdb = saved


def one_round(store: Path) -> float:
    from dfit_mlir.fleet import store as bundle_store
    from dfit_mlir.fleet.store import policy

    started = time.perf_counter()
    rows = bundle_store.query(store, report="top-sites", parameters={"limit": 50}, threads=min(2, policy.machine_cores()))
    elapsed = time.perf_counter() - started
    assert rows.num_rows > 0
    return elapsed


def check_cost(text: str, repeat: int = 200) -> float:
    from dfit_mlir.fleet.store import policy

    started = time.perf_counter()
    for _ in range(repeat):
        policy.check_duckdb(text)
    return (time.perf_counter() - started) / repeat


def spark_check_cost(store: Path, text: str, repeat: int = 20) -> float:
    from dfit_mlir.fleet.store import engines

    engine = engines.SparkEngine(str(store))
    engine._check(text)  # the parser's first use compiles its classes
    started = time.perf_counter()
    for _ in range(repeat):
        engine._check(text)
    return (time.perf_counter() - started) / repeat


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--runs", type=int, default=4, help="real runs of the convnet collected (no --store)")
    parser.add_argument("--store", type=Path, default=None)
    parser.add_argument("--spark", action="store_true", help="time Spark's plan check too")
    args = parser.parse_args(argv)
    from dfit_mlir.fleet import store as bundle_store
    from dfit_mlir.fleet.store import dialects

    with tempfile.TemporaryDirectory(prefix="dfit-policy-bench-") as scratch:
        store = args.store or real_store(Path(scratch), args.runs)
        events = bundle_store.query(store, "SELECT count(*) AS n FROM events").column(0)[0].as_py()
        one_round(store)  # warm the file cache and the imports
        with without_policy():
            one_round(store)
        timed: dict[str, list[float]] = {"with the policy": [], "without (before)": []}
        for _ in range(args.rounds):
            timed["with the policy"].append(one_round(store))
            with without_policy():
                timed["without (before)"].append(one_round(store))
        text = bundle_store.report_sql("top-sites", dialects.DUCKDB, {"limit": 50})
        duck_check = check_cost(text)
        spark_check = spark_check_cost(store, bundle_store.report_sql("top-sites", dialects.SPARK, {"limit": 50})) \
            if args.spark else None
    load = os.getloadavg()[0]
    medians = {name: statistics.median(values) for name, values in timed.items()}
    with_policy, before = medians["with the policy"], medians["without (before)"]
    lines = [BEGIN, "## Query policy: `top-sites` with and without the read-only policy", "",
             f"Measured {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC on this {os.cpu_count()}-core machine "
             f"(shared; 1-minute load average {load:.1f} at the end). Store: "
             + (f"`{args.store}`" if args.store else f"the convnet compiled by IREE and run {args.runs} times (real "
                "runs), collected with its compile manifest")
             + f" ({events} events). {args.rounds} rounds, alternating; each opens a fresh DuckDB engine (2 threads) "
             "and runs `top-sites --limit 50` once. *Without* is a plain connection and no check of the text "
             "(dfit before the policy). Command:", "", "```", command_line(__file__, argv), "```", "",
             "| | median | p10 | p90 |", "|---|---|---|---|"]
    for name, values in timed.items():
        deciles = statistics.quantiles(values, n=10)
        lines.append(f"| {name} | {medians[name] * 1000:.1f} ms | {deciles[0] * 1000:.1f} ms | "
                     f"{deciles[-1] * 1000:.1f} ms |")
    lines += ["", f"Overhead of the policy: **{(with_policy - before) * 1000:+.1f} ms** per query "
              f"({(with_policy / before - 1) * 100:+.1f} %, medians). The DuckDB check alone (parsing the report's "
              f"text, {len(text)} characters): {duck_check * 1e6:.0f} µs."]
    if spark_check is not None:
        lines.append(f"Spark's check of the same report (its parser, the plan as JSON, the walk): "
                     f"{spark_check * 1000:.1f} ms per query.")
    publish(lines, begin=BEGIN, end=END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
