"""The same store and the same report SQL on a real local Spark (``local[2]``, one
SparkSession for the test session): every named report returns the rows DuckDB returns,
and the dialect rules of ``dfit_mlir/fleet/store/dialects.py`` hold on Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dfit_mlir.fleet import store as bundle_store
from tests.store_fixtures import *  # noqa: F403  (the store fixtures)
from tests.store_fixtures import SLOWED_ID

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def normalized(table: Any) -> list[dict[str, Any]]:
    """Rows with floats rounded (the engines may sum doubles in another order)."""
    return [{k: round(v, 6) if isinstance(v, float) else v for k, v in row.items()} for row in table.to_pylist()]


#: The mean QA found the engines rounding apart: 340143159 ns over 20 events.
HALF_MEAN_TOTAL, HALF_MEAN_EVENTS = 340143159, 20


@pytest.fixture(scope="module")
def half_mean_store(tmp_path_factory: pytest.TempPathFactory, iree_bundles: dict[str, Path]) -> tuple[Path, str]:
    """A store of the convnet's full run (real) where one root op keeps 20 of its timed
    events, their times SYNTHETIC, summing to 340143159 ns: mean 17007157.95, which
    ROUND(·, 1) makes .9 on DuckDB."""
    import json
    import shutil

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from dfit_mlir.fleet.store import collect

    root = tmp_path_factory.mktemp("half-mean")
    bundle = root / "bundle"
    shutil.copytree(iree_bundles["full"], bundle)
    events = pq.read_table(bundle / "events.parquet")
    timed = pc.and_(pc.is_valid(events.column("root_id")), pc.is_valid(events.column("duration_ns")))
    roots = pc.value_counts(events.filter(timed).column("root_id")).to_pylist()
    chosen = max(roots, key=lambda entry: (entry["counts"], entry["values"]))["values"]
    mine = pc.fill_null(pc.and_(timed, pc.equal(events.column("root_id"), chosen)), False)
    # Copies of its events if it has fewer than 20 (a run repeats them anyway).
    theirs = events.filter(mine)
    while theirs.num_rows < HALF_MEAN_EVENTS:
        theirs = pa.concat_tables([theirs, theirs])
    theirs = theirs.slice(0, HALF_MEAN_EVENTS)
    share = HALF_MEAN_TOTAL // HALF_MEAN_EVENTS
    durations = [share] * (HALF_MEAN_EVENTS - 1) + [HALF_MEAN_TOTAL - share * (HALF_MEAN_EVENTS - 1)]
    theirs = theirs.set_column(theirs.column_names.index("duration_ns"), "duration_ns", pa.array(durations, pa.int64()))
    edited = pa.concat_tables([events.filter(pc.invert(mine)), theirs])
    pq.write_table(edited, bundle / "events.parquet")
    # The summary says how many events the bundle keeps (collect's ledger reads it as analyze does).
    summary = json.loads((bundle / "summary.json").read_text())
    summary["counts"]["kept"] = edited.num_rows
    (bundle / "summary.json").write_text(json.dumps(summary))
    store = root / "store"
    collect([bundle], store)
    return store, chosen


def test_report_values_are_the_same_doubles_on_both_engines(half_mean_store: tuple[Path, str]) -> None:
    """Compared exactly, not rounded: one SQL text, the same rows (QA: ROUND(double, 1)
    gave 17007157.9 on DuckDB and another value on Spark)."""
    half, chosen = half_mean_store
    on = {engine: bundle_store.query(half, report="top-sites", parameters={"limit": 1000}, engine=engine)
          for engine in ("duckdb", "spark")}
    assert on["spark"].to_pylist() == on["duckdb"].to_pylist()
    # The chosen root's dispatch ran HALF_MEAN_EVENTS times; its ops' locations share its
    # time (the ledger's split, in whole ns), each mean the same double on both engines.
    located = [row for row in on["duckdb"].to_pylist() if row["events"] == HALF_MEAN_EVENTS]
    assert located and all(row["mean_ns"] == row["total_ns"] / HALF_MEAN_EVENTS for row in located)
    totals = f"SELECT events, total_ns FROM op_totals WHERE root_id = '{chosen}'"
    dispatch = ("SELECT CAST(SUM(time_ns) AS BIGINT) AS total_ns, MAX(calls) AS calls FROM op_ledger WHERE partition IN "
                f"(SELECT partition FROM op_ledger WHERE op_id = '{chosen}' AND role = 'root')")
    for engine in ("duckdb", "spark"):
        assert bundle_store.query(half, totals, engine=engine).to_pylist() == \
            [{"events": HALF_MEAN_EVENTS, "total_ns": HALF_MEAN_TOTAL}]
        assert bundle_store.query(half, dispatch, engine=engine).to_pylist() == \
            [{"total_ns": HALF_MEAN_TOTAL, "calls": HALF_MEAN_EVENTS}]
    assert HALF_MEAN_TOTAL / HALF_MEAN_EVENTS == 17007157.95
    # What the reports did before: the engines disagree on this very value.
    rounded = "SELECT ROUND(CAST(340143159 AS DOUBLE) / 20, 1) AS r"
    assert bundle_store.query(half, rounded, engine="spark").to_pylist() != bundle_store.query(half, rounded).to_pylist()


REPORTS = [
    ("top-sites", {"limit": 50}),
    ("regressions", {"baseline": "base", "candidate": "slow"}),
    ("regressions", {"baseline": "slow", "candidate": "base"}),
    ("rank-skew", {}),
    ("coverage", {}),
]


@pytest.mark.parametrize(("report", "parameters"), REPORTS)
def test_spark_returns_the_rows_duckdb_returns(store: Path, report: str, parameters: dict[str, Any]) -> None:
    duckdb = bundle_store.query(store, report=report, parameters=parameters)
    spark = bundle_store.query(store, report=report, parameters=parameters, engine="spark")
    duckdb_rows = duckdb.to_pylist()
    assert duckdb_rows and spark.to_pylist() == duckdb_rows  # exactly: the same doubles
    assert [field.type for field in spark.schema] == [field.type for field in duckdb.schema]
    if report == "regressions" and parameters["candidate"] == "slow":
        assert SLOWED_ID in {row["op_id"] for row in duckdb_rows}  # with the ops fused into its dispatch


@pytest.mark.parametrize("use_rollups", [True, False])
def test_compacted_store_gives_spark_and_duckdb_the_rows_of_the_store(store: Path, compacted_store: Path,
                                                                   use_rollups: bool) -> None:
    """``dfit store compact`` (parts with run as a column, Hive backend/model directories,
    the index) read by both engines: every report's rows as before compaction; and with
    op_totals computed from the events on Spark too (what a 1.0 store reads)."""
    for report, parameters in REPORTS:
        before = normalized(bundle_store.query(store, report=report, parameters=parameters))
        for engine in ("spark", "duckdb"):
            after = bundle_store.query(compacted_store, report=report, parameters=parameters, engine=engine,
                                       use_rollups=use_rollups)
            assert normalized(after) == before, (report, parameters, engine)
    sql = ("SELECT run, kind, count(*) AS n, CAST(SUM(duration_ns) AS BIGINT) AS total FROM events "
           "GROUP BY run, kind ORDER BY run NULLS LAST, kind NULLS LAST")
    assert bundle_store.query(compacted_store, sql, engine="spark").to_pylist() == \
        bundle_store.query(store, sql).to_pylist()
    # As a URL (what object stores take): Spark globs the bundles (none match: all are in
    # parts) and reads the compaction index itself.
    url = f"file://{compacted_store}"
    assert bundle_store.query(url, sql, engine="spark").to_pylist() == bundle_store.query(store, sql).to_pylist()
    top = normalized(bundle_store.query(url, report="top-sites", parameters={"limit": 50}, engine="spark",
                                        use_rollups=use_rollups))
    assert top == normalized(bundle_store.query(store, report="top-sites", parameters={"limit": 50}))


def test_spark_reads_the_tables_with_the_store_schema(store: Path) -> None:
    sql = ("SELECT backend, model, kind, count(*) AS n, count(step) AS steps, count(rank) AS ranked, "
           "CAST(SUM(duration_ns) AS BIGINT) AS total FROM events GROUP BY backend, model, kind "
           "ORDER BY backend NULLS LAST, model NULLS LAST, kind NULLS LAST")
    assert normalized(bundle_store.query(store, sql, engine="spark")) == normalized(bundle_store.query(store, sql))
    runs = "SELECT run, label, host, rank, kind FROM runs ORDER BY run NULLS LAST"
    assert bundle_store.query(store, runs, engine="spark").to_pylist() == bundle_store.query(store, runs).to_pylist()


def test_dialect_rules_hold_on_spark(store: Path) -> None:
    from dfit_mlir.fleet.store import dialects, engines

    tricky = "it's a \\path\\ 'quoted'"
    sql = (f"SELECT {dialects.SPARK.literal(tricky)} AS s, get_json_object('{{\"a\": 3}}', '$.a') AS j, "
           "'a' || NULL AS joined, CAST(SUM(duration_ns) AS BIGINT) AS total FROM events WHERE kind = 'dispatch'")
    spark = engines.SparkEngine(str(store)).sql(sql).to_pylist()
    duck = engines.DuckDBEngine(str(store)).sql(sql.replace(dialects.SPARK.literal(tricky),
                                                            dialects.DUCKDB.literal(tricky))).to_pylist()
    assert spark == duck and spark[0]["s"] == tricky and spark[0]["j"] == "3" and spark[0]["joined"] is None
    order = "SELECT x FROM (SELECT CAST(NULL AS INT) AS x UNION ALL SELECT 1) t ORDER BY x NULLS LAST"
    assert engines.SparkEngine(str(store)).sql(order).to_pylist() == [{"x": 1}, {"x": None}]


def test_a_table_named_after_a_comma_is_set_up_when_the_engine_misses_it(compacted_store: Path) -> None:
    """Views are set up for the tables after FROM/JOIN; ``FROM runs r, events e`` names
    events otherwise: both engines report it missing, it is set up, the query reruns."""
    sql = ("SELECT r.label, count(*) AS n FROM runs r, events e WHERE r.run = e.run AND e.kind = 'dispatch' "
           "GROUP BY r.label ORDER BY r.label NULLS LAST")
    spark = bundle_store.query(compacted_store, sql, engine="spark").to_pylist()
    assert spark == bundle_store.query(compacted_store, sql).to_pylist()
    assert {row["label"] for row in spark} >= {"base", "slow", "same", "job"}


def test_spark_query_errors_are_one_line(store: Path) -> None:
    from dfit_mlir.fleet.store.engines import QueryError

    with pytest.raises(QueryError, match=r"query failed \(spark\): .*nope"):
        bundle_store.query(store, "SELECT nope FROM events", engine="spark")


def test_spark_storage_it_cannot_read_is_one_line_exit_3(store: Path) -> None:
    """``s3a://`` without hadoop-aws on the classpath: the engine's failure (exit 3), the
    Java exception's message only, never its stack."""
    from dfit_mlir.fleet.store.engines import EngineError

    bundle_store.query(store, "SELECT 1 AS x", engine="spark")  # the session is up: this is quick
    with pytest.raises(EngineError) as caught:
        bundle_store.query("s3a://bucket/store", report="top-sites", engine="spark")
    message = str(caught.value)
    assert caught.value.exit_code == 3 and "\n" not in message and "\tat " not in message
    assert message.startswith("s3a://bucket/store: spark cannot read it: ") and "S3AFileSystem" in message
    assert "hadoop-aws" in message


def test_spark_result_with_list_columns_streams_to_csv_as_json(store: Path, tmp_path: Path) -> None:
    import json

    import pyarrow as pa
    import pyarrow.csv as pacsv

    from dfit_mlir.fleet.store import output

    sql = "SELECT run, site, ids FROM sites ORDER BY run, site"
    with bundle_store.prepare(store, sql, engine="spark") as prepared:
        schema, batches = prepared.stream()
        written = output.write(schema, batches, table_path=tmp_path / "sites.csv", keep=2)
    expected = bundle_store.query(store, sql).to_pylist()
    assert written.rows == len(expected) > 0 and written.head.to_pylist() == expected[:2]
    csv = pacsv.read_csv(tmp_path / "sites.csv", convert_options=pacsv.ConvertOptions(
        column_types={"ids": pa.string(), "run": pa.string()}))
    assert [json.loads(text) for text in csv.column("ids").to_pylist()] == [row["ids"] for row in expected]
