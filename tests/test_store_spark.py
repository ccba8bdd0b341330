"""The same store and the same report SQL on a real local Spark (``local[2]``, one
SparkSession for the test session): every named report returns the rows DuckDB returns,
and the dialect rules of ``dfit_mlir/store/dialects.py`` hold on Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dfit_mlir import store as bundle_store
from tests.store_fixtures import *  # noqa: F403  (the store fixtures)
from tests.store_fixtures import SLOWED_ID

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def normalized(table: Any) -> list[dict[str, Any]]:
    """Rows with floats rounded (the engines may sum doubles in another order)."""
    return [{k: round(v, 6) if isinstance(v, float) else v for k, v in row.items()} for row in table.to_pylist()]


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
    duckdb_rows = normalized(duckdb)
    assert duckdb_rows and normalized(spark) == duckdb_rows
    assert [field.type for field in spark.schema] == [field.type for field in duckdb.schema]
    if report == "regressions" and parameters["candidate"] == "slow":
        assert [row["root_id"] for row in duckdb_rows] == [SLOWED_ID]


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


def test_spark_reads_the_tables_with_the_store_schema(store: Path) -> None:
    sql = ("SELECT backend, model, kind, count(*) AS n, count(step) AS steps, count(rank) AS ranked, "
           "CAST(SUM(duration_ns) AS BIGINT) AS total FROM events GROUP BY backend, model, kind "
           "ORDER BY backend NULLS LAST, model NULLS LAST, kind NULLS LAST")
    assert normalized(bundle_store.query(store, sql, engine="spark")) == normalized(bundle_store.query(store, sql))
    runs = "SELECT run, label, host, rank, kind FROM runs ORDER BY run NULLS LAST"
    assert bundle_store.query(store, runs, engine="spark").to_pylist() == bundle_store.query(store, runs).to_pylist()


def test_dialect_rules_hold_on_spark(store: Path) -> None:
    from dfit_mlir.store import dialects, engines

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
    from dfit_mlir.store.engines import QueryError

    with pytest.raises(QueryError, match=r"query failed \(spark\): .*nope"):
        bundle_store.query(store, "SELECT nope FROM events", engine="spark")
