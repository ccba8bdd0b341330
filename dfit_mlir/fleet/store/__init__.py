"""The bundle store: many bundles (runs, reconstructions, compile manifests, of many
models, backends, hosts and ranks) in one Hive-partitioned Parquet dataset, queried with
DuckDB in-process or Spark SQL on a cluster, with the same SQL.

* :func:`collect` adds bundles (``dfit collect``);
* :func:`query` runs SQL or a named report (``dfit query``) and returns an Arrow table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dfit_mlir.fleet.store.collect import Collected, Placement, collect, open_store
from dfit_mlir.fleet.store.reports import REPORTS

__all__ = ["Collected", "Placement", "Prepared", "REPORTS", "collect", "open_store", "prepare", "query", "report_sql"]


def report_sql(name: str, dialect: Any, parameters: dict[str, Any] | None = None) -> str:
    from dfit_mlir.fleet.store import reports

    return reports.get(name).render(dialect, parameters or {})


class Prepared:
    """A query ready to run on an engine: the SQL text (a report's rendered) and its
    engine; close it when done. ``table()`` is every row, ``head(n)`` the first ``n``
    only, ``stream()`` (schema, record batches) in bounded memory."""

    def __init__(self, runner: Any, text: str, report: str | None, parameters: dict[str, Any] | None = None):
        self.runner, self.text, self.report, self.parameters = runner, text, report, parameters or {}

    def table(self) -> Any:
        return self.runner.sql(self.text)

    def head(self, rows: int) -> Any:
        return self.runner.head(self.text, rows)

    def stream(self) -> Any:
        return self.runner.stream(self.text)

    def empty_note(self) -> str | None:
        """Why the report gave no rows, where the store tells (None: no such check)."""
        from dfit_mlir.fleet.store import reports

        if self.report is None:
            return None
        return reports.why_empty(self.report, self.parameters, lambda sql: self.runner.sql(sql).to_pylist(),
                                 self.runner.dialect)

    def close(self) -> None:
        self.runner.close()

    def __enter__(self) -> Prepared:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def prepare(store: str | Path, sql: str | None = None, *, report: str | None = None,
            parameters: dict[str, Any] | None = None, engine: str = "duckdb", master: str | None = None,
            **engine_options: Any) -> Prepared:
    """``sql`` or the named ``report`` over ``store`` on ``engine``, checked (parameters,
    the labels a report compares) but not run yet."""
    from dfit_mlir.core.errors import InvalidInputError
    from dfit_mlir.fleet.store import engines, layout, reports

    if (sql is None) == (report is None):
        raise InvalidInputError("give either SQL or a report name")
    if sql is not None and not sql.strip():
        raise InvalidInputError("empty query: give SQL or a report name "
                                f"({', '.join(sorted(REPORTS))})")
    location = str(store)
    text = None
    if report is not None:
        from dfit_mlir.fleet.store.dialects import DUCKDB, SPARK

        # Parameters are checked before an engine (a Spark session) starts.
        text = report_sql(report, SPARK if engine == "spark" else DUCKDB, parameters)
    if "://" not in location:
        open_store(Path(location), create=False)
    runner = engines.engine(engine, location, master=master, **engine_options)
    try:
        if report is not None:
            bound = parameters or {}
            if any(bound.get(name) is not None for name in ("baseline", "candidate")):
                labels = runner.sql(f"SELECT DISTINCT label FROM {layout.RUNS_TABLE}").column(0).to_pylist()
                reports.check_labels(report, bound, labels)
        return Prepared(runner, sql if text is None else text, report, parameters)
    except BaseException:
        runner.close()
        raise


def query(store: str | Path, sql: str | None = None, *, report: str | None = None,
          parameters: dict[str, Any] | None = None, engine: str = "duckdb", master: str | None = None,
          **engine_options: Any) -> Any:
    """Run ``sql`` or the named ``report`` over ``store`` on ``engine``; an Arrow table."""
    with prepare(store, sql, report=report, parameters=parameters, engine=engine, master=master,
                 **engine_options) as prepared:
        return prepared.table()
