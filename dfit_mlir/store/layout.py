"""The bundle store's layout and table schemas, versioned.

A store is a directory::

    STORE/dfit-store.json                       layout version, event schema version
    STORE/bundles/backend=B/model=M/run=R/      one directory per bundle (renamed into
        events.parquet sites.parquet            place whole, so a bundle is in the store
        operators.parquet partitions.parquet    completely or not at all)
        coverage.parquet runs.parquet

``backend``, ``model`` and ``run`` are Hive partition keys (read from the path by DuckDB
and Spark alike, as strings); the files do not repeat them. ``host`` and ``rank`` are
columns, not keys: one data-parallel log holds the events of many ranks, and splitting
it per rank would make thousands of tiny files. ``run`` is the bundle's ID: its
session, so collecting the same bundle twice is a no-op.

The ``events`` table is the event schema (``schemas/events-1.yaml``) minus ``backend``
plus the columns the store adds (:data:`EVENT_EXTRA`); a store whose files were written
with an older minor of either reads with the missing columns as nulls (the engines
project every table onto :func:`table_columns`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final

from dfit_mlir import event_schema as es

STORE_SCHEMA: Final = "dfit.store"
STORE_VERSION: Final = "1.0"
META_FILE: Final = "dfit-store.json"
BUNDLES: Final = "bundles"
#: Hive partition keys, outermost first.
PARTITION_KEYS: Final = ("backend", "model", "run")
TABLES: Final = ("events", "sites", "operators", "partitions", "coverage", "runs")

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
}


def table_columns(table: str) -> tuple[tuple[str, str], ...]:
    """(name, portable type) of every column of ``table``, partition keys excluded."""
    if table == "events":
        types = {f["name"]: f["type"] for f in es.schema_document()["fields"]}
        fields = tuple((name, "string" if kind == "dict_string" else kind)
                       for name, kind in types.items() if name != es.BACKEND)
        return fields + EVENT_EXTRA
    return _TABLE_COLUMNS[table]


def arrow_schema(table: str) -> Any:
    """The Arrow schema ``table``'s files are written with."""
    import pyarrow as pa

    if table == "events":
        base = es.arrow_schema()
        extra = {"string": pa.string(), "int32": pa.int32(), "int64": pa.int64()}
        fields = [f for f in base if f.name != es.BACKEND]
        fields += [pa.field(name, extra[kind]) for name, kind in EVENT_EXTRA]
        return pa.schema(fields, metadata={**base.metadata, b"dfit.store.version": STORE_VERSION.encode()})
    types = {"string": pa.string(), "int32": pa.int32(), "int64": pa.int64(), "list<string>": pa.list_(pa.string())}
    return pa.schema([pa.field(name, types[kind]) for name, kind in _TABLE_COLUMNS[table]],
                     metadata={b"dfit.store.version": STORE_VERSION.encode()})


_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


def partition_value(text: str | None) -> str:
    """A Hive-path-safe partition value (``/``, ``=``, spaces → ``_``); ``unknown`` for none."""
    cleaned = _UNSAFE.sub("_", text or "").strip("._")
    return cleaned or "unknown"


def bundle_dir(store: Path, backend: str, model: str, run: str) -> Path:
    return store / BUNDLES / f"backend={backend}" / f"model={model}" / f"run={run}"


def table_glob(store: str, table: str) -> str:
    """The glob of ``table``'s files under ``store`` (a path or URL)."""
    return f"{store.rstrip('/')}/{BUNDLES}/*/*/*/{table}.parquet"


def bundle_dirs(store: Path) -> list[Path]:
    return sorted((store / BUNDLES).glob("backend=*/model=*/run=*"))
