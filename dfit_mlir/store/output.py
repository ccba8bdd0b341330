"""Query results out: a printed table, CSV / Parquet files, a Perfetto trace of the selected events."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dfit_mlir import atomic
from dfit_mlir import event_schema as es
from dfit_mlir.errors import InvalidInputError


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
    """``.csv`` or ``.parquet`` by the suffix, written atomically."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    suffix = path.suffix.lower()
    if suffix not in (".csv", ".parquet"):
        raise InvalidInputError(f"{path}: write .csv or .parquet")
    with atomic.atomic_path(path) as tmp:
        if suffix == ".csv":
            pacsv.write_csv(table, tmp)
        else:
            pq.write_table(table, tmp, compression="zstd")


def write_trace(table: Any, path: Path) -> int:
    """The selected events as a Perfetto trace: one track group per run (and rank, where known)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from dfit_mlir.traces import _BATCH_ROWS, PerfettoWriter

    missing = [name for name in (es.START_NS, es.KIND, es.STAGE) if name not in table.column_names]
    if missing:
        raise InvalidInputError(f"--trace needs the events' {', '.join(missing)} in the result "
                                "(select them, e.g. SELECT * FROM events WHERE ...)")
    if "run" in table.column_names:
        group = pc.binary_join_element_wise("run ", table.column("run").cast(pa.string()), "")
        if "rank" in table.column_names:
            rank = pc.binary_join_element_wise(" rank ", table.column("rank").cast(pa.string()), "")
            group = pc.binary_join_element_wise(group, pc.fill_null(rank, ""), "")
        table = table.append_column("track_group", group)
    with atomic.atomic_path(path) as tmp, tmp.open("wb") as stream:
        writer = PerfettoWriter({}, stream)
        return writer.write_batches(table.to_batches(max_chunksize=_BATCH_ROWS))
