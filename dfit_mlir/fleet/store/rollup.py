"""Rollup tables: small per-bundle aggregates of ``events`` written at collect time so
the named reports read thousands of rows instead of scanning every event (store layout
1.1; see :mod:`dfit_mlir.fleet.store.layout`).

A rollup is one SQL text (``sql/<table>.rollup.sql``, written in the dialect subset of
:mod:`dfit_mlir.fleet.store.dialects`) run three ways: by ``dfit collect`` on DuckDB over the
bundle's freshly written ``events.parquet``; by either engine over the ``events`` view
for bundles a 1.0 layout wrote without the file; and by the tests against the stored
rows. ``events`` stays the source of truth.
"""

from __future__ import annotations

import functools
import string
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from dfit_mlir.fleet.store import dialects, layout


def sql(table: str, source: str) -> str:
    """The rollup ``table`` over ``source`` (a relation: ``events`` or a parenthesized,
    aliased subquery), with backend, model and run as its first columns."""
    text = resources.files("dfit_mlir.fleet.store").joinpath(f"sql/{table}.rollup.sql").read_text()
    return string.Template(text).substitute(source=source)


def over_events(table: str, dialect: dialects.Dialect, runs: Sequence[str] | None = None) -> str:
    """The rollup computed from the ``events`` view, of ``runs`` only (None: every run)."""
    if runs is None:
        return sql(table, "events")
    chosen = ", ".join(dialect.literal(run) for run in runs)
    return sql(table, f"(SELECT * FROM events WHERE run IN ({chosen})) chosen_events")


def compute(table: str, events: Path) -> Any:
    """Rollup ``table`` of one bundle's ``events`` file (DuckDB, in-process, memory bounded
    by its streaming aggregation), as an Arrow table with the store's schema for it."""
    import pyarrow as pa

    source = (f"(SELECT '' AS backend, '' AS model, '' AS run, * "
              f"FROM read_parquet({dialects.DUCKDB.literal(str(events))})) bundle_events")
    columns = ", ".join(dialects.DUCKDB.identifier(name) for name, _ in layout.table_columns(table))
    result: Any = _connection().sql(f"SELECT {columns} FROM ({sql(table, source)}) rollup ORDER BY 1").to_arrow_table()
    schema = layout.arrow_schema(table)
    return pa.Table.from_arrays([result.column(f.name).cast(f.type) for f in schema], schema=schema)


def write(table: str, events: Path, target: Path) -> int:
    """Write rollup ``table`` of one bundle's ``events`` file to ``target``; returns its rows."""
    import pyarrow.parquet as pq

    rolled = compute(table, events)
    pq.write_table(rolled, target, compression="zstd")
    return rolled.num_rows


@functools.cache
def _connection() -> Any:
    """One in-process DuckDB for the rollups of every bundle a process collects (the
    first query of a connection costs ~10× the next ones)."""
    return layout.require("duckdb").connect(config={"threads": 1})
