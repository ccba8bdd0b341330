"""Query results out: a printed table, CSV / Parquet files, a Perfetto trace of the selected events.

The files go where the user names them, so they follow :mod:`dfit_mlir.core.outputs`: an
existing file is replaced only when dfit wrote it (recorded in the output ledger when it
is written, under :data:`TABLE_KIND` / :data:`TRACE_KIND`) or with ``--force``, and never
when it is, or lies inside, the store read (it would become part of the dataset)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dfit_mlir.core import atomic
from dfit_mlir.core import event_schema as es
from dfit_mlir.core.errors import InvalidInputError, OutputRefusedError

#: Output-ownership kinds (``dfit_mlir.core.outputs``) of ``dfit query -o`` and ``--trace``.
TABLE_KIND = "query-table"
TRACE_KIND = "query-trace"
TABLE_SUFFIXES = (".csv", ".parquet")


def check_paths(store: str, table: Path | None, trace: Path | None, *, force: bool = False) -> None:
    """Refuse (exit 2, one line naming the path) an output dfit may not write, before the
    query runs: a table file of another suffix, one path given for both outputs, a path
    that is, contains or lies inside the store (a local one; a URL is the cluster's), or an
    existing file dfit did not write (unless ``force``)."""
    from dfit_mlir.core import outputs

    if table is not None and trace is not None and outputs.resolve(table) == outputs.resolve(trace):
        raise OutputRefusedError(f"{trace}: -o and --trace name the same file")
    inputs = [] if "://" in store else [store]
    for path, kind in ((table, TABLE_KIND), (trace, TRACE_KIND)):
        if path is not None:
            outputs.check(path, kind, inputs=inputs, force=force, directory=False)
    # After what the path is (the input, a user's file), the more telling reason.
    if table is not None and table.suffix.lower() not in TABLE_SUFFIXES:
        raise InvalidInputError(f"{table}: -o writes .csv or .parquet (by the suffix)")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        # Rounded here, never in the SQL (the engines round doubles differently).
        return f"{value:.1f}" if abs(value) >= 1e5 else f"{value:.6g}"
    if isinstance(value, (list, dict)):
        return _json_text(value)
    return str(value)


def render(table: Any, shown: int = 50, *, total: int | None = None) -> str:
    """``table``'s first ``shown`` rows, aligned columns. ``total``: how many rows the
    result has; ``None``: ``table`` is all of them, or (``table`` holding ``shown + 1``
    rows of a result read only that far) "more" without a count."""
    names = table.column_names
    rows = table.slice(0, shown).to_pylist()
    cells = [[_cell(row[name]) for name in names] for row in rows]
    widths = [max([len(name)] + [len(line[k]) for line in cells]) for k, name in enumerate(names)]
    lines = ["  ".join(name.ljust(width) for name, width in zip(names, widths, strict=True)).rstrip(),
             "  ".join("-" * width for width in widths)]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in cells]
    if total is not None:
        if total > shown:
            lines.append(f"… {total - shown} more rows")
        lines.append(f"({total} rows)")
    elif table.num_rows > shown:
        lines.append("… more rows (write them all with -o)")
    else:
        lines.append(f"({table.num_rows} rows)")
    return "\n".join(lines)


def _json_text(value: Any) -> str:
    import json

    return json.dumps(value, default=str, ensure_ascii=False)


def _nested(kind: Any) -> bool:
    import pyarrow as pa

    return (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)
            or pa.types.is_struct(kind) or pa.types.is_map(kind) or pa.types.is_union(kind)
            or (pa.types.is_dictionary(kind) and _nested(kind.value_type)))


def csv_schema(schema: Any) -> Any:
    """``schema`` as CSV holds it: list / struct / map columns as JSON text."""
    import pyarrow as pa

    return pa.schema([pa.field(field.name, pa.string()) if _nested(field.type) else field for field in schema])


def csv_batch(batch: Any, schema: Any) -> Any:
    """``batch`` with its nested columns as JSON text (CSV has no lists: ``["a", "b"]``)."""
    import pyarrow as pa

    columns = [pa.array([None if value is None else _json_text(value) for value in column.to_pylist()], pa.string())
               if _nested(column.type) else column for column in batch.columns]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def write_table(table: Any, path: Path) -> None:
    """``.csv`` or ``.parquet`` by the suffix, written atomically and recorded as dfit's
    (call :func:`check_paths` first: this refuses only a file dfit did not write)."""
    write(table.schema, table.to_batches(), table_path=path)


def write_trace(table: Any, path: Path) -> int:
    """The selected events as a Perfetto trace: one track group per run, and per rank where
    known, else per task (pid) where the reader tagged one (a data-parallel log's tasks)."""
    return write(table.schema, table.to_batches(), trace_path=path).traced


@dataclass(frozen=True)
class Written:
    head: Any  # the first rows (as many as asked), an Arrow table
    rows: int
    traced: int  # events in the trace


def write(schema: Any, batches: Iterable[Any], *, table_path: Path | None = None, trace_path: Path | None = None,
          keep: int = 0) -> Written:
    """Stream ``batches`` to the table file and / or the trace in one pass (bounded
    memory), each written atomically and recorded as dfit's; keeps the first ``keep``
    rows to print. A bad row for the trace (checked batch by batch) leaves neither file."""
    import pyarrow as pa

    from dfit_mlir.exporters.traces import BATCH_ROWS

    if trace_path is not None:
        check_trace_schema(schema)
    with contextlib.ExitStack() as stack:
        sinks = []
        if table_path is not None:
            sinks.append(_table_sink(stack, schema, table_path))
        writer = None
        if trace_path is not None:
            from dfit_mlir.exporters.perfetto import PerfettoWriter

            tmp = stack.enter_context(atomic.atomic_path(trace_path, TRACE_KIND))
            writer = PerfettoWriter({}, stack.enter_context(tmp.open("wb")))
        kept, rows = [], 0
        for batch in batches:
            if rows < keep:
                kept.append(batch.slice(0, keep - rows))
            for sink in sinks:
                sink(batch)
            if writer is not None:
                for chunk in pa.Table.from_batches([batch], schema=schema).to_batches(max_chunksize=BATCH_ROWS):
                    writer.write_batch(_trace_batch(chunk, rows))
            rows += batch.num_rows
        return Written(pa.Table.from_batches(kept, schema=schema), rows, writer.written if writer else 0)


def _table_sink(stack: contextlib.ExitStack, schema: Any, path: Path) -> Any:
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    tmp = stack.enter_context(atomic.atomic_path(path, TABLE_KIND))
    if path.suffix.lower() == ".csv":
        target = csv_schema(schema)
        writer = stack.enter_context(pacsv.CSVWriter(str(tmp), target))
        return lambda batch: writer.write_batch(csv_batch(batch, target))
    writer = stack.enter_context(pq.ParquetWriter(str(tmp), schema, compression="zstd"))
    return writer.write_batch


def check_trace_schema(schema: Any) -> None:
    """The columns a trace needs, of types it can hold (exit 2 naming the column)."""
    import pyarrow as pa

    missing = [name for name in (es.START_NS, es.KIND, es.STAGE) if name not in schema.names]
    if missing:
        raise InvalidInputError(f"--trace needs the events' {', '.join(missing)} in the result "
                                "(select them, e.g. SELECT * FROM events WHERE ...)")
    for name in (es.START_NS, es.DURATION_NS):
        if name in schema.names and not (pa.types.is_integer(schema.field(name).type)
                                         or pa.types.is_null(schema.field(name).type)):
            raise InvalidInputError(f"--trace: column {name} is {schema.field(name).type}, not integer "
                                    f"nanoseconds (select the events' own {name}, or CAST it AS BIGINT)")
    for name in (es.KIND, es.STAGE):
        kind = schema.field(name).type
        if pa.types.is_dictionary(kind):
            kind = kind.value_type
        if pa.types.is_null(kind):
            raise InvalidInputError(f"--trace: column {name} is NULL in every row (a trace event needs one)")
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise InvalidInputError(f"--trace: column {name} is {schema.field(name).type}, not text")


def _trace_batch(batch: Any, offset: int) -> Any:
    """``batch`` checked for the trace (kind set, times not negative: exit 2 naming the
    first bad row, counted from 1 in the result) with its track group column added."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = batch.schema.names
    timed = pc.is_valid(batch.column(es.START_NS))
    checks = [(pc.and_(timed, pc.is_null(batch.column(es.KIND))), f"{es.KIND} is NULL (a trace event needs a kind)"),
              (pc.less(batch.column(es.START_NS), 0), f"{es.START_NS} is negative")]
    if es.DURATION_NS in names:
        checks.append((pc.less(batch.column(es.DURATION_NS), 0), f"{es.DURATION_NS} is negative"))
    for mask, problem in checks:
        bad = pc.fill_null(mask, False)
        if pc.any(bad).as_py():
            row = pc.index(bad, True).as_py()
            raise InvalidInputError(f"--trace: row {offset + row + 1} of the result: {problem}")
    if "run" not in names:
        return batch
    count = batch.num_rows
    # The group names what a reader of the trace needs to tell runs apart: the model,
    # the run, the host (where collected with one), then the rank or task.
    group = pc.binary_join_element_wise("run ", batch.column("run").cast(pa.string()), "")
    if "model" in names:
        group = pc.binary_join_element_wise(batch.column("model").cast(pa.string()), " · ", group, "")
    if "host" in names:
        host = pc.binary_join_element_wise(" · host ", batch.column("host").cast(pa.string()), "")
        group = pc.binary_join_element_wise(group, pc.fill_null(host, ""), "")
    within = pa.nulls(count, pa.string())
    if "pid" in names:
        within = pc.binary_join_element_wise(" task pid ", batch.column("pid").cast(pa.string()), "")
    if "rank" in names:
        rank = pc.binary_join_element_wise(" rank ", batch.column("rank").cast(pa.string()), "")
        within = pc.coalesce(rank, within)
    group = pc.binary_join_element_wise(group, pc.fill_null(within, ""), "")
    return pa.RecordBatch.from_arrays([*batch.columns, group], names=[*names, "track_group"])
