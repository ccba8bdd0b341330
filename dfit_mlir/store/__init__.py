"""The bundle store: many bundles (runs, reconstructions, compile manifests, of many
models, backends, hosts and ranks) in one Hive-partitioned Parquet dataset, queried with
DuckDB in-process or Spark SQL on a cluster, with the same SQL.

* :func:`collect` adds bundles (``dfit collect``);
* :func:`query` runs SQL or a named report (``dfit query``) and returns an Arrow table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dfit_mlir.store.collect import Collected, Placement, collect, open_store
from dfit_mlir.store.reports import REPORTS

__all__ = ["Collected", "Placement", "REPORTS", "collect", "open_store", "query", "report_sql"]


def report_sql(name: str, dialect: Any, parameters: dict[str, Any] | None = None) -> str:
    from dfit_mlir.store import reports

    return reports.get(name).render(dialect, parameters or {})


def query(store: str | Path, sql: str | None = None, *, report: str | None = None,
          parameters: dict[str, Any] | None = None, engine: str = "duckdb", master: str | None = None,
          **engine_options: Any) -> Any:
    """Run ``sql`` or the named ``report`` over ``store`` on ``engine``; an Arrow table."""
    from dfit_mlir.errors import InvalidInputError
    from dfit_mlir.store import engines

    if (sql is None) == (report is None):
        raise InvalidInputError("give either SQL or a report name")
    location = str(store)
    if "://" not in location:
        open_store(Path(location), create=False)
    runner = engines.engine(engine, location, master=master, **engine_options)
    try:
        text = sql if sql is not None else report_sql(report, runner.dialect, parameters)
        return runner.sql(text)
    finally:
        runner.close()
