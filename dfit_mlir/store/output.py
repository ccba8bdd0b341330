"""Query results out: a printed table, CSV / Parquet files, a Perfetto trace of the selected events.

The files go where the user names them, so they follow :mod:`dfit_mlir.outputs`: an
existing file is replaced only when dfit wrote it (recorded in the output ledger when it
is written, under :data:`TABLE_KIND` / :data:`TRACE_KIND`) or with ``--force``, and never
when it is, or lies inside, the store read (it would become part of the dataset)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dfit_mlir import atomic
from dfit_mlir import event_schema as es
from dfit_mlir.errors import InvalidInputError, OutputRefusedError

#: Output-ownership kinds (``dfit_mlir.outputs``) of ``dfit query -o`` and ``--trace``.
TABLE_KIND = "query-table"
TRACE_KIND = "query-trace"
TABLE_SUFFIXES = (".csv", ".parquet")


def check_paths(store: str, table: Path | None, trace: Path | None, *, force: bool = False) -> None:
    """Refuse (exit 2, one line naming the path) an output dfit may not write, before the
    query runs: a table file of another suffix, one path given for both outputs, a path
    that is, contains or lies inside the store (a local one; a URL is the cluster's), or an
    existing file dfit did not write (unless ``force``)."""
    from dfit_mlir import outputs

    if table is not None and trace is not None and outputs.resolve(table) == outputs.resolve(trace):
        raise OutputRefusedError(f"{trace}: -o and --trace name the same file")
    inputs = [] if "://" in store else [store]
    for path, kind in ((table, TABLE_KIND), (trace, TRACE_KIND)):
        if path is not None:
            outputs.check(path, kind, inputs=inputs, force=force, directory=False)
    if table is not None and table.suffix.lower() not in TABLE_SUFFIXES:
        raise InvalidInputError(f"{table}: -o writes .csv or .parquet (by the suffix)")


def render(table: Any, shown: int = 50) -> str:
    """``table``'s first ``shown`` rows, aligned columns."""
    names = table.column_names
    rows = table.slice(0, shown).to_pylist()

    def text(value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, float):
            return f"{value:.6g}"
        return str(value)

    cells = [[text(row[name]) for name in names] for row in rows]
    widths = [max([len(name)] + [len(line[k]) for line in cells]) for k, name in enumerate(names)]
    lines = ["  ".join(name.ljust(width) for name, width in zip(names, widths, strict=True)).rstrip(),
             "  ".join("-" * width for width in widths)]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in cells]
    if table.num_rows > shown:
        lines.append(f"… {table.num_rows - shown} more rows (write them all with -o)")
    lines.append(f"({table.num_rows} rows)")
    return "\n".join(lines)


def write_table(table: Any, path: Path) -> None:
    """``.csv`` or ``.parquet`` by the suffix, written atomically and recorded as dfit's
    (call :func:`check_paths` first: this refuses only a file dfit did not write)."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    suffix = path.suffix.lower()
    if suffix not in TABLE_SUFFIXES:
        raise InvalidInputError(f"{path}: -o writes .csv or .parquet (by the suffix)")
    with atomic.atomic_path(path, TABLE_KIND) as tmp:
        if suffix == ".csv":
            pacsv.write_csv(table, tmp)
        else:
            pq.write_table(table, tmp, compression="zstd")


def write_trace(table: Any, path: Path) -> int:
    """The selected events as a Perfetto trace: one track group per run, and per rank where
    known, else per task (pid) where the reader tagged one (a data-parallel log's tasks)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from dfit_mlir.traces import _BATCH_ROWS, PerfettoWriter

    missing = [name for name in (es.START_NS, es.KIND, es.STAGE) if name not in table.column_names]
    if missing:
        raise InvalidInputError(f"--trace needs the events' {', '.join(missing)} in the result "
                                "(select them, e.g. SELECT * FROM events WHERE ...)")
    if "run" in table.column_names:
        group = pc.binary_join_element_wise("run ", table.column("run").cast(pa.string()), "")
        within = pa.nulls(table.num_rows, pa.string())
        if "pid" in table.column_names:
            within = pc.binary_join_element_wise(" task pid ", table.column("pid").cast(pa.string()), "")
        if "rank" in table.column_names:
            rank = pc.binary_join_element_wise(" rank ", table.column("rank").cast(pa.string()), "")
            within = pc.coalesce(rank, within)
        group = pc.binary_join_element_wise(group, pc.fill_null(within, ""), "")
        table = table.append_column("track_group", group)
    with atomic.atomic_path(path, TRACE_KIND) as tmp, tmp.open("wb") as stream:
        writer = PerfettoWriter({}, stream)
        return writer.write_batches(table.to_batches(max_chunksize=_BATCH_ROWS))
