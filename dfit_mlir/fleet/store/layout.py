"""The bundle store's layout and table schemas, versioned.

A store is a directory::

    STORE/dfit-store.json                       layout version, event schema version
    STORE/bundles/backend=B/model=M/run=R/      one directory per bundle (renamed into
        events.parquet sites.parquet            place whole, so a bundle is in the store
        operators.parquet partitions.parquet    completely or not at all)
        coverage.parquet runs.parquet
        op_totals.parquet                       (layout 1.1: a rollup of events.parquet)
        op_ledger.parquet                       (layout 1.2: the ledger's per-op entries)

``backend``, ``model`` and ``run`` are Hive partition keys (read from the path by DuckDB
and Spark alike, as strings); the files do not repeat them. ``host`` and ``rank`` are
columns, not keys: one data-parallel log holds the events of many ranks, and splitting
it per rank would make thousands of tiny files. ``run`` is the bundle's ID: its
session, so collecting the same bundle twice is a no-op.

The ``events`` table is the event schema (``schemas/events-1.yaml``) minus ``backend``
plus the columns the store adds (:data:`EVENT_EXTRA`); a store whose files were written
with an older minor of either reads with the missing columns as nulls (the engines
project every table onto :func:`table_columns`).

Layout 1.1 adds compaction (``dfit store compact``, :mod:`dfit_mlir.fleet.store.compact`):
the tables of many bundles merged into a few larger files per partition::

    STORE/compacted/index.json                  the commit: parts and runs compacted
    STORE/compacted/TABLE/backend=B/model=M/part-ID.parquet   run is a column

The index lists, per run compacted, the tables of it that are in parts (every table
but ``events`` for a bundle of many events, whose file is large enough to stay); such a
table is read from the parts the index lists, never from the run's bundle directory
(which keeps its ownership marker, so collecting it again is a no-op). A part the
index does not list is not part of the store.

Layout 1.1 also adds ``op_totals`` (:mod:`dfit_mlir.fleet.store.rollup`): per bundle and root op,
the events' count, total, min, max and sum of squares of ``duration_ns``, computed at
collect time by the same SQL the engines run over ``events`` for bundles written by
1.0 (which have no such file). ``events`` stays the source of truth for ad-hoc SQL.

Layout 1.2 adds ``op_ledger``: the entries of the bundle's ledger
(:mod:`dfit_mlir.analysis.ledger`, one row per dispatch call site or group and compute op: role,
module path, source line, phase, placed FLOPs / transcendentals / MACs, boundary bytes,
the op's share of the dispatch's measured time under the named ``time_model``, calls,
executed figures), computed by the ledger module at collect time from the bundle's
manifest and events — never re-derived in SQL. ``top-sites`` and ``regressions`` read
it, so a fused GELU's line gets its share of its dispatch's time instead of nothing
(``op_totals`` gives a whole dispatch's time to its root op: it is what the events say,
kept for ad-hoc SQL). The ledger needs the manifest's tensor graph and costs, which the
store does not keep, so a bundle collected by an older layout (no ``op_ledger.parquet``)
cannot get its rows at read time: a query that reads the table is refused with one line
naming the bundle, and ``dfit collect`` of that bundle again adds the table to the
stored bundle in place (label, host and rank kept).
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Any, Final

from dfit_mlir.core import event_schema as es
from dfit_mlir.core import reading

STORE_SCHEMA: Final = "dfit.store"
STORE_VERSION: Final = "1.2"
META_FILE: Final = "dfit-store.json"
BUNDLES: Final = "bundles"
#: Hive partition keys, outermost first.
PARTITION_KEYS: Final = ("backend", "model", "run")
TABLES: Final = ("events", "sites", "operators", "partitions", "coverage", "runs", "op_totals", "op_ledger")
#: The table every bundle has (whatever layout minor wrote it): a bundle directory is
#: one of the store's bundles when it holds this file.
RUNS_TABLE: Final = "runs"
#: Tables derived from ``events`` at collect time; a bundle without the file (layout
#: 1.0) gets the rows computed by the engine from its events (``rollup.sql``).
ROLLUP_TABLES: Final = ("op_totals",)
#: The ledger's entries (layout 1.2), written by collect from the bundle, not from SQL.
LEDGER_TABLE: Final = "op_ledger"

#: Columns the store adds to the event schema: where the event ran.
EVENT_EXTRA: Final = (
    ("host", "string"),
    ("rank", "int32"),   # event attribute ``rank``, else the bundle's --rank
    ("pid", "int64"),    # event attribute ``pid`` (the task that logged a reconstructed figure)
    ("run_scope", "string"),  # event attribute ``run_scope`` (one run/compile within a file)
)

#: Column name → portable type (DuckDB and Spark both read these from Parquet).
_TABLE_COLUMNS: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    "sites": (("site", "int32"), ("function", "string"), ("partition", "string"), ("root_id", "string"),
              ("ids", "list<string>")),
    "operators": (("id", "string"), ("op", "string"), ("source_file", "string"), ("source_line", "int32"),
                  ("source_col", "int32"), ("module_path", "string"), ("module_class", "string"),
                  ("source_op", "string"), ("phase", "string"), ("macs", "int64"), ("flops", "int64"),
                  ("bytes", "int64")),
    "partitions": (("name", "string"), ("kind", "string"), ("root_id", "string"), ("operators", "int32"),
                   ("operator_ids", "list<string>")),
    "coverage": (("aspect", "string"), ("status", "string"), ("detail", "string")),
    "runs": (("kind", "string"), ("mode", "string"), ("label", "string"), ("host", "string"), ("rank", "int32"),
             ("toolchain", "string"), ("recorded_at", "string"), ("collected_at", "string"),
             ("source", "string"), ("model_input", "string"), ("events", "int64"),
             ("event_schema", "string"), ("clock_offset_ns", "int64")),
    # Per root op of the bundle's timed events (root_id and duration_ns not null).
    # run_instances: the bundle's distinct invocations (else steps) among those events,
    # the same on every row: what ``regressions`` divides a run's total by.
    "op_totals": (("root_id", "string"), ("events", "int64"), ("total_ns", "int64"), ("min_ns", "int64"),
                  ("max_ns", "int64"), ("sumsq_ns", "float64"), ("run_instances", "int64")),
    # The ledger's entries (dfit_mlir.analysis.ledger.ENTRY_COLUMNS, its spec), plus where the op
    # is in the source and the bundle's run_instances (as in op_totals: what regressions
    # divides a run's time by). time_ns: the op's share of its partition's measured time
    # in whole ns, apportioned by largest remainder so that a partition's entries sum to
    # its measured time exactly (and sums are exact integers on every engine); site: the
    # dispatch call site.
    "op_ledger": (("partition", "string"), ("site", "int32"), ("op_id", "string"), ("op", "string"),
                  ("role", "string"), ("module_path", "string"), ("source_file", "string"),
                  ("source_line", "int32"), ("phase", "string"), ("macs", "int64"), ("flops", "int64"),
                  ("transcendentals", "int64"), ("bytes_read", "int64"), ("bytes_written", "int64"),
                  ("weight", "float64"), ("share", "float64"), ("calls", "int64"), ("time_ns", "int64"),
                  ("executed_macs", "int64"), ("executed_flops", "int64"),
                  ("executed_transcendentals", "int64"), ("time_model", "string"), ("run_instances", "int64")),
}


@functools.cache
def table_columns(table: str) -> tuple[tuple[str, str], ...]:
    """(name, portable type) of every column of ``table``, partition keys excluded."""
    if table == "events":
        types = {f["name"]: f["type"] for f in es.schema_document()["fields"]}
        fields = tuple((name, "string" if kind == "dict_string" else kind)
                       for name, kind in types.items() if name != es.BACKEND)
        return fields + EVENT_EXTRA
    return _TABLE_COLUMNS[table]


@functools.cache
def arrow_schema(table: str) -> Any:
    """The Arrow schema ``table``'s files are written with (immutable: cached)."""
    import pyarrow as pa

    if table == "events":
        base = es.arrow_schema()
        extra = {"string": pa.string(), "int32": pa.int32(), "int64": pa.int64()}
        fields = [f for f in base if f.name != es.BACKEND]
        fields += [pa.field(name, extra[kind]) for name, kind in EVENT_EXTRA]
        return pa.schema(fields, metadata={**base.metadata, b"dfit.store.version": STORE_VERSION.encode()})
    types = {"string": pa.string(), "int32": pa.int32(), "int64": pa.int64(), "float64": pa.float64(),
             "list<string>": pa.list_(pa.string())}
    return pa.schema([pa.field(name, types[kind]) for name, kind in _TABLE_COLUMNS[table]],
                     metadata={b"dfit.store.version": STORE_VERSION.encode()})


_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


def partition_value(text: str | None) -> str:
    """A Hive-path-safe partition value (``/``, ``=``, spaces → ``_``); ``unknown`` for none."""
    cleaned = _UNSAFE.sub("_", text or "").strip("._")
    return cleaned or "unknown"


def require(module: str) -> Any:
    """``module`` of the ``store`` extra (duckdb, pyspark), or a one-line error saying how
    to install it (``dfit collect`` computes its rollups with DuckDB, queries run on it)."""
    import importlib

    from dfit_mlir.core.errors import ToolchainError

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ToolchainError(f"the bundle store needs {module}: pip install 'dfit-mlir[store]'") from None


COMPACTED: Final = "compacted"
INDEX_FILE: Final = "index.json"
INDEX_SCHEMA: Final = "dfit.store.compacted"


def read_index(store: Path) -> dict[str, Any]:
    """The compaction index of a local store (parts per table, runs compacted); empty when
    the store was never compacted."""

    from dfit_mlir.core.errors import InvalidInputError

    path = store / COMPACTED / INDEX_FILE
    if not path.exists() and not path.is_symlink():
        return {"schema": INDEX_SCHEMA, "parts": {}, "runs": {}}
    reading.inside(store, f"{COMPACTED}/{INDEX_FILE}", "compaction index")  # no symlink out of the store
    document = reading.load_json(path, what="compaction index")
    if not isinstance(document, dict) or document.get("schema") != INDEX_SCHEMA:
        raise InvalidInputError(f"{path}: not a dfit store compaction index")
    check_index(document, store, path)
    return document


#: A part's path in the index: ``backend=B/model=M/part-ID.parquet`` (compact.py names them).
_PART_NAME = re.compile(r"backend=[^/\\]+/model=[^/\\]+/part-[0-9a-f]{1,64}\.parquet")


def check_index(document: dict[str, Any], store: Path | None, source: str | Path) -> None:
    """Every path the index names stays in the store (core/reading.py): parts are
    ``backend=B/model=M/part-ID.parquet`` of a known table, runs name plain backend,
    model and run names and known tables; anything else refuses the store."""
    from dfit_mlir.core.errors import InvalidInputError

    parts, runs = document.get("parts"), document.get("runs")
    if not isinstance(parts, dict) or not isinstance(runs, dict):
        raise InvalidInputError(f"{source}: not a dfit store compaction index (no parts and runs)")
    for table, names in parts.items():
        if table not in TABLES or not isinstance(names, list):
            raise InvalidInputError(f"{source}: parts of an unknown table {str(table)[:80]!r}")
        for name in names:
            if not isinstance(name, str) or not _PART_NAME.fullmatch(name) or ".." in name.split("/"):
                raise InvalidInputError(f"{source}: part path {str(name)[:200]!r} is not a part of this store "
                                        "(absolute, `..` or not backend=B/model=M/part-ID.parquet)")
            for key in name.split("/")[:2]:
                reading.simple_name(key.split("=", 1)[1], "a partition value", source)
            if store is not None:
                reading.inside(store / COMPACTED / table, name, "part path")
    for run, placed in runs.items():
        reading.simple_name(run, "run", source)
        if not isinstance(placed, dict):
            raise InvalidInputError(f"{source}: run {run[:80]!r} is not an object")
        for key in ("backend", "model"):
            reading.simple_name(placed.get(key), f"run {run[:80]!r}'s {key}", source)
        tables = placed.get("tables")
        if not isinstance(tables, list) or any(table not in TABLES for table in tables):
            raise InvalidInputError(f"{source}: run {run[:80]!r} lists tables that are not the store's")


def part_path(store: str, table: str, relative: str) -> str:
    """A compacted part's path (or URL) from its path in the index."""
    return f"{store.rstrip('/')}/{COMPACTED}/{table}/{relative}"


def conform(batch: Any, schema: Any) -> Any:
    """``batch`` (a RecordBatch or Table) with ``schema``'s columns, in order: columns an
    older minor did not write become nulls, others are cast to the current type."""
    import pyarrow as pa

    arrays = []
    for field in schema:
        if field.name in batch.schema.names:
            column = batch.column(field.name)
            arrays.append(column if column.type == field.type else column.cast(field.type))
        else:
            arrays.append(pa.nulls(batch.num_rows, field.type))
    return type(batch).from_arrays(arrays, schema=schema)


def bundle_dir(store: Path, backend: str, model: str, run: str) -> Path:
    return store / BUNDLES / f"backend={backend}" / f"model={model}" / f"run={run}"


def table_glob(store: str, table: str) -> str:
    """The glob of ``table``'s files under ``store`` (a path or URL)."""
    return f"{store.rstrip('/')}/{BUNDLES}/*/*/*/{table}.parquet"


#: Ownership kinds of a store's bundle directories (``collect.STORE_BUNDLE_KIND``; stores
#: collected before that kind existed carry the generic one).
BUNDLE_MARKER_KINDS: Final = ("store-bundle", "output")


def bundle_dirs(store: Path) -> list[Path]:
    """The store's bundle directories, each checked to be dfit's own: a real directory
    inside the store (no symlink on the way: a link to a bundle elsewhere would be read as
    part of this store) holding ``dfit collect``'s ownership marker, whose table files are
    regular files the marker lists. Anything else named like a bundle or a table is
    refused (one line naming it), never read as part of the store; a dot-named entry (a
    write in progress: ``.run=R.XXXX.tmp``) or a file of another name is not listed."""
    root = store / BUNDLES
    if root.is_symlink():
        raise _foreign(root, "a symlink; a store's bundles are the ones dfit collect wrote into it")
    found = []
    for backend in _partition_entries(root, "backend"):
        for model in _partition_entries(backend, "model"):
            for run in _partition_entries(model, "run"):
                _check_bundle_dir(run)
                found.append(run)
    return found


def _partition_entries(folder: Path, key: str) -> list[Path]:
    if not folder.is_dir():
        return []
    entries = sorted(folder.glob(f"{key}=*"))
    for entry in entries:
        if entry.is_symlink():
            raise _foreign(entry, f"a symlink (to {os.readlink(entry)}); a store holds only the bundles dfit collect "
                                  "wrote into it: collect that bundle into the store instead")
        if not entry.is_dir():
            raise _foreign(entry, "not a directory")
    return entries


def _check_bundle_dir(run: Path) -> None:
    from dfit_mlir.core import outputs

    marker = outputs.read_marker(run)
    if marker is None or marker.get("kind") not in BUNDLE_MARKER_KINDS:
        raise _foreign(run, "not a bundle dfit collect wrote (no store-bundle ownership marker in it)")
    owned = set(marker.get("files") or ())
    for table in TABLES:
        path = run / f"{table}.parquet"
        if path.is_symlink():
            raise _foreign(path, f"a symlink (to {os.readlink(path)}), not a table file dfit collect wrote")
        if not path.exists():
            continue  # compacted into parts, or a table of a later layout
        if path.name not in owned:
            raise _foreign(path, "not written by dfit collect (its bundle's ownership marker does not list it)")
        if not path.is_file():
            raise _foreign(path, "not a regular file (the store is damaged)")


def _foreign(path: Path, why: str) -> Exception:
    from dfit_mlir.core.errors import InvalidInputError

    return InvalidInputError(f"{path}: {why}")
