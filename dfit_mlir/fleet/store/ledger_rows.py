"""The store's ``op_ledger`` table (layout 1.2): one bundle's ledger entries, as
:mod:`dfit_mlir.analysis.ledger` computes them, with where each op is in the source.

Nothing here splits a time, rounds one or counts a cost: the rows are the ledger's
(:attr:`dfit_mlir.analysis.ledger.Ledger.entries`), so ``dfit query top-sites`` and
``dfit analyze`` give a line the same time. Added to each row: the op's source file and
line (what ``top-sites`` falls back to where an op has no module path) and the bundle's
``run_instances`` (its invocations, else steps, among the timed events with a root op:
the ``op_totals`` rule, what ``regressions`` divides a run's time by).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dfit_mlir.fleet.store import layout


def ledger_table(source: Path, run_instances: int | None) -> Any:
    """The ``op_ledger`` rows of the bundle (or compile manifest) at ``source``."""
    import pyarrow as pa

    from dfit_mlir.analysis.ledger import Ledger
    from dfit_mlir.analysis.model import SemanticModel

    model = SemanticModel.open(source)
    entries = Ledger(model).entries
    ops = entries.column("op_id").to_pylist()
    sources = [(model.operators[i].source or {}) if i in model.operators else {} for i in ops]
    given = {name: entries.column(name) for name in entries.column_names}
    given["source_file"] = pa.array([s.get("file") for s in sources], pa.string())
    given["source_line"] = pa.array([s.get("line") for s in sources], pa.int32())
    given["run_instances"] = pa.array([run_instances] * len(ops), pa.int64())
    schema = layout.arrow_schema(layout.LEDGER_TABLE)
    columns = [_column(given.get(f.name), f.type, len(ops)) for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)


def _column(values: Any, kind: Any, rows: int) -> Any:
    """A ledger column in the store's type: whole figures (MACs, FLOPs, bytes) as int64
    (the ledger keeps what it placed: whole numbers), a column it lacks as nulls."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if values is None:
        return pa.nulls(rows, kind)
    if pa.types.is_integer(kind) and pa.types.is_floating(values.type):
        values = pc.round(values)
    return values.cast(kind)


def with_run_instances(table: Any, run_instances: int | None) -> Any:
    """``table`` (:func:`ledger_table`'s) with the bundle's ``run_instances`` (known once
    its ``op_totals`` rollup is)."""
    import pyarrow as pa

    column = table.schema.get_field_index("run_instances")
    return table.set_column(column, table.schema.field(column),
                            pa.array([run_instances] * table.num_rows, pa.int64()))


def write(source: Path, target: Path, run_instances: int | None) -> int:
    """Write ``source``'s ``op_ledger`` table to ``target``; returns its rows."""
    return write_table(ledger_table(source, run_instances), target)


def write_table(table: Any, target: Path) -> int:
    """Write an ``op_ledger`` table to ``target``; returns its rows."""
    import pyarrow.parquet as pq

    pq.write_table(table, target, compression="zstd")
    return table.num_rows


def run_instances(op_totals: Path) -> int | None:
    """The bundle's ``run_instances``, read from its ``op_totals`` file (None: no timed event)."""
    import pyarrow.parquet as pq

    column = pq.read_table(op_totals, columns=["run_instances"]).column("run_instances")
    return column[0].as_py() if len(column) else None
