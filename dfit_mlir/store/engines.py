"""Query engines over a store: DuckDB (in-process, the default) and Spark SQL (PySpark,
local or a cluster). Both expose every table of the store as a view with the current
schema's columns (columns an older minor lacks read as nulls) plus the Hive partition
keys, and return results as Arrow tables.

A table's view is set up the first time a query reads it (setting one up reads the
footer of each of its files). It is the union of the bundle directories' files and the
compacted parts the index lists (:mod:`dfit_mlir.store.compact`; a run is read from one
or the other, never both); the rollup ``op_totals`` adds the rows computed from
``events`` for bundles that have no such file (layout 1.0), or is computed from
``events`` entirely with ``use_rollups=False``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Protocol

from dfit_mlir.errors import DfitError, InvalidInputError
from dfit_mlir.store import dialects, layout, rollup


class QueryError(DfitError):
    """The SQL did not run (syntax, unknown column): bad input."""

    exit_code = 2


class Engine(Protocol):
    dialect: dialects.Dialect

    def sql(self, text: str) -> Any: ...

    def close(self) -> None: ...


def _projection(table: str, present: set[str], dialect: dialects.Dialect) -> list[str]:
    """SELECT items giving ``table`` its current columns, whatever minor wrote the files."""
    items = list(layout.PARTITION_KEYS)
    for name, kind in layout.table_columns(table):
        items.append(dialect.identifier(name) if name in present else
                     f"CAST(NULL AS {dialect.type_name(kind)}) AS {dialect.identifier(name)}")
    return items


_NAMED = re.compile(r"\b(?:FROM|JOIN)\s+([A-Za-z_][A-Za-z0-9_]*)", re.IGNORECASE)


def tables_named(text: str) -> list[str]:
    """The store tables ``text`` reads after FROM or JOIN: their views are set up before
    it runs (each costs a read of every file's footer, so only those). A table named
    otherwise (``FROM a, events``) is set up when the engine reports it missing."""
    words = {word.lower() for word in _NAMED.findall(text)}
    return [table for table in layout.TABLES if table in words]


def missing_table(message: str, registered: Any) -> str | None:
    """The store table an engine's "no such table" error names, if not set up yet."""
    lowered = message.lower()
    if "does not exist" not in lowered and "cannot be found" not in lowered:
        return None
    for table in layout.TABLES:
        if table not in registered and re.search(rf"\b{table}\b", lowered):
            return table
    return None


class _StoreFiles:
    """Which files hold each table of a store: the bundle directories' files, except for
    runs the compaction index lists, which are read from its parts (never from both)."""

    def __init__(self, store: str, *, use_rollups: bool = True):
        self.location = store
        self.local = "://" not in store
        self.use_rollups = use_rollups
        self.index: dict[str, Any] = {"parts": {}, "runs": {}}
        self.dirs: list[Path] = []
        if self.local:
            self.index = layout.read_index(Path(store))
            self.dirs = layout.bundle_dirs(Path(store))
            if not self.bundles() and not self.index["runs"]:
                raise InvalidInputError(f"{store}: the store holds no bundles yet (add some with `dfit collect`)")

    def bundles(self) -> list[Path]:
        """The bundle directories not compacted (all their tables are in them)."""
        return [path for path in self.dirs if (path / f"{layout.RUNS_TABLE}.parquet").is_file()
                and _run(path) not in self.index["runs"]]

    def in_parts(self, run: str, table: str) -> bool:
        return table in self.index["runs"].get(run, {}).get("tables", ())

    def read_remote_index(self, read_text: Any) -> None:
        """A URL store's compaction index, read with the engine's own reader (None: absent)."""
        import json

        text = read_text(f"{self.location.rstrip('/')}/{layout.COMPACTED}/{layout.INDEX_FILE}")
        if text:
            document = json.loads(text)
            if document.get("schema") == layout.INDEX_SCHEMA:
                self.index = document

    def listing(self) -> tuple[Any, ...] | None:
        """What the views of a local store were set up for, to tell when they are stale."""
        if not self.local:
            return None
        return (tuple(str(path) for path in self.bundles()),
                tuple((table, tuple(names)) for table, names in sorted(self.index["parts"].items())))

    def bundle_files(self, table: str) -> list[str] | None:
        """``table``'s files in bundle directories (None: not known, a URL: use the glob)."""
        if not self.local:
            return None
        return [str(path / f"{table}.parquet") for path in self.dirs
                if (path / f"{table}.parquet").is_file() and not self.in_parts(_run(path), table)]

    def parts(self, table: str) -> list[str]:
        return [layout.part_path(self.location, table, name) for name in self.index["parts"].get(table, [])]

    def compacted_runs(self, table: str) -> list[str]:
        """Runs whose ``table`` rows are in parts."""
        return sorted(run for run in self.index["runs"] if self.in_parts(run, table))

    def without(self, table: str) -> list[str] | None:
        """Runs of the bundles that have no ``table`` file (written by layout 1.0); None: not known."""
        if not self.local:
            return None
        return [_run(path) for path in self.bundles() if not (path / f"{table}.parquet").is_file()]


def _run(bundle: Path) -> str:
    return bundle.name.split("=", 1)[1]


def _empty(table: str, dialect: dialects.Dialect) -> str:
    """A query of ``table``'s columns with no rows (a table no file holds yet)."""
    items = [f"CAST(NULL AS STRING) AS {key}" for key in layout.PARTITION_KEYS]
    items += [f"CAST(NULL AS {dialect.type_name(kind)}) AS {dialect.identifier(name)}"
              for name, kind in layout.table_columns(table)]
    return f"SELECT {', '.join(items)} WHERE 1 = 0"


def _rollup_body(engine: Any, table: str) -> str:
    """The view body of rollup ``table`` on ``engine``: its files, and for the bundles
    without one (written by layout 1.0) the rows computed from their events. Registers
    the views it reads (``engine._register_files``, ``engine._register``)."""
    dialect = engine.dialect
    files_view = f"{table}_files"
    missing = engine.files.without(table)
    if not engine.files.use_rollups:  # asked to compute every row from the events
        missing, files = ["*"], None
    elif missing is None:  # a URL: which runs lack the file, asked of the engine itself
        engine._register(layout.RUNS_TABLE)
        runs = [row[0] for row in engine._rows(f"SELECT DISTINCT run FROM {layout.RUNS_TABLE}")]
        engine._register_files(table, files_view)
        have = {row[0] for row in engine._rows(f"SELECT DISTINCT run FROM {files_view}")}
        missing = sorted(set(runs) - have)
        files = files_view if have else None
    else:
        files = files_view if engine._register_files(table, files_view) else None
    columns = ", ".join([*layout.PARTITION_KEYS, *(dialect.identifier(name) for name, _ in layout.table_columns(table))])
    parts = [f"SELECT {columns} FROM {files}"] if files is not None else []
    if missing:
        engine._register("events")
        computed = rollup.over_events(table, dialect, None if files is None else missing)
        parts.append(f"SELECT {columns} FROM ({computed}) computed_{table}")
    return "\nUNION ALL\n".join(parts)


class DuckDBEngine:
    """DuckDB over the Parquet files where they are (nothing is loaded up front; a
    table's view is set up the first time a query names it)."""

    dialect = dialects.DUCKDB

    def __init__(self, store: str, *, threads: int | None = None, memory_limit: str | None = None,
                 use_rollups: bool = True):
        import duckdb

        config: dict[str, Any] = {}
        if threads:
            config["threads"] = threads
        if memory_limit:
            config["memory_limit"] = memory_limit
        self.files = _StoreFiles(store, use_rollups=use_rollups)
        self.connection = duckdb.connect(config=config)
        # Footers are read once per connection, not at every bind of a view.
        self.connection.execute("SET parquet_metadata_cache = true")
        for statement in self.dialect.prelude:
            self.connection.execute(statement)
        self.views: set[str] = set()
        if not self.files.local:
            self.files.read_remote_index(self._read_text)

    def _read_text(self, location: str) -> str | None:
        try:
            rows = self.connection.execute("SELECT content FROM read_text(?)", [location]).fetchall()
        except self.errors():
            return None
        return rows[0][0] if rows else None

    def _register(self, table: str) -> None:
        if table in self.views:
            return
        if table in layout.ROLLUP_TABLES:
            self.connection.execute(f"CREATE VIEW {table} AS {_rollup_body(self, table)}")
        else:
            self._register_files(table, table)
        self.views.add(table)

    def _rows(self, text: str) -> list[tuple[Any, ...]]:
        return self.connection.execute(text).fetchall()

    @staticmethod
    def errors() -> type[Exception]:
        import duckdb

        return duckdb.Error

    def _register_files(self, table: str, name: str) -> bool:
        """View ``name``: ``table``'s rows in bundle files and compacted parts; False when
        no file holds any (the view is then empty)."""
        sources = []
        bundle_files = self.files.bundle_files(table)
        glob = layout.table_glob(self.files.location, table)
        if bundle_files is None or bundle_files:
            sources.append((glob if bundle_files is None else bundle_files, layout.PARTITION_KEYS,
                            self.files.compacted_runs(table) if bundle_files is None else []))
        parts = self.files.parts(table)
        if parts:
            sources.append((parts, layout.PARTITION_KEYS[:-1], []))
        selects = []
        for files, keys, excluded in sources:
            listed = (self.dialect.literal(files) if isinstance(files, str) else
                      "[" + ", ".join(self.dialect.literal(path) for path in files) + "]")
            hive_types = "{" + ", ".join(f"'{key}': 'VARCHAR'" for key in keys) + "}"
            source = f"read_parquet({listed}, hive_partitioning=true, union_by_name=true, hive_types={hive_types})"
            try:
                present = {row[0] for row in self.connection.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}
            except self.errors():
                if bundle_files is None:  # a URL store whose bundles are all compacted: no file matches
                    continue
                raise
            where = (" WHERE run NOT IN (" + ", ".join(self.dialect.literal(run) for run in excluded) + ")"
                     if excluded else "")
            selects.append(f"SELECT {', '.join(_projection(table, present, self.dialect))} FROM {source}{where}")
        self.connection.execute(f"CREATE VIEW {name} AS {' UNION ALL '.join(selects) or _empty(table, self.dialect)}")
        return bool(selects)

    def sql(self, text: str) -> Any:
        import duckdb

        try:
            for table in tables_named(text):
                self._register(table)
            while True:
                try:
                    relation = self.connection.sql(text)
                    break
                except duckdb.CatalogException as error:
                    table = missing_table(str(error), self.views)
                    if table is None:
                        raise
                    self._register(table)
            if relation is None:  # a statement, not a query
                import pyarrow as pa

                return pa.table({})
            return relation.to_arrow_table()
        except duckdb.Error as error:
            raise QueryError(f"query failed (duckdb): {str(error).splitlines()[0]}") from None

    def close(self) -> None:
        self.connection.close()


_SPARK_SESSION: Any = None
#: (store, table) → the bundle listing and rollup use its view was registered for (one
#: SparkSession per process).
_SPARK_VIEWS: dict[tuple[str, str], tuple[tuple[str, ...] | None, bool]] = {}


def spark_session(master: str | None = None) -> Any:
    """One SparkSession per process (Spark allows one active context); quiet, UTC, with
    partition values read as strings like DuckDB reads them."""
    global _SPARK_SESSION
    if _SPARK_SESSION is not None:
        return _SPARK_SESSION
    os.environ.setdefault("PYSPARK_PYTHON", _python())
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no "hostname resolves to loopback" warning
    from importlib import resources

    from pyspark.sql import SparkSession

    log_config = resources.files("dfit_mlir.store").joinpath("log4j2.properties")

    builder = (SparkSession.builder.appName("dfit-query")
               .master(master or os.environ.get("DFIT_SPARK_MASTER", "local[2]"))
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
               .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log_config}")
               .config("spark.sql.ansi.enabled", "false"))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    _SPARK_SESSION = session
    return session


def _python() -> str:
    import sys

    return sys.executable


class SparkEngine:
    """Spark SQL over the same store path (a local directory, or an s3a:// / hdfs:// URL);
    a table's view is registered the first time a query names it."""

    dialect = dialects.SPARK

    def __init__(self, store: str, *, master: str | None = None, use_rollups: bool = True):
        self.files = _StoreFiles(store, use_rollups=use_rollups)
        self.session = spark_session(master)
        if not self.files.local:
            self.files.read_remote_index(self._read_text)

    def _register(self, table: str) -> None:
        store = self.files.location
        listing = self.files.listing()
        registered = (listing, self.files.use_rollups)
        if listing is not None and _SPARK_VIEWS.get((store, table)) == registered:
            return  # registered for this store, and its bundles have not changed
        if table in layout.ROLLUP_TABLES:
            self.session.sql(f"CREATE OR REPLACE TEMP VIEW {table} AS {_rollup_body(self, table)}")
        else:
            self._register_files(table, table)
        _SPARK_VIEWS[(store, table)] = registered

    def _rows(self, text: str) -> list[tuple[Any, ...]]:
        return [tuple(row) for row in self.session.sql(text).collect()]

    def _register_files(self, table: str, name: str) -> bool:
        """Temp view ``name``: ``table``'s rows in bundle files and compacted parts; False
        when no file holds any (the view is then empty)."""
        from pyspark.errors import PySparkException

        location = self.files.location.rstrip("/")
        columns = [f"`{column}` {self.dialect.type_name(kind)}" for column, kind in layout.table_columns(table)]
        keys = [f"`{key}` STRING" for key in layout.PARTITION_KEYS]
        order = [*layout.PARTITION_KEYS, *(column for column, _ in layout.table_columns(table))]
        frames = []
        bundle_files = self.files.bundle_files(table)
        if bundle_files is None or bundle_files:
            # The store's schema, given: no inference job, and columns an older minor's
            # files lack read as nulls.
            reader = self.session.read.schema(", ".join(keys + columns)).option("basePath", f"{location}/{layout.BUNDLES}")
            try:
                frame = reader.parquet(*(bundle_files or [layout.table_glob(location, table)]))
                excluded = self.files.compacted_runs(table) if bundle_files is None else []
                if excluded:
                    frame = frame.where(~frame["run"].isin(excluded))
                frames.append(frame.select(*order))
            except PySparkException:
                if bundle_files is not None:
                    raise
                # else a URL store whose bundles are all compacted: no file matches the glob
        parts = self.files.parts(table)
        if parts:
            # backend and model from the path, run a column of the part
            reader = self.session.read.schema(", ".join(keys + columns)).option("basePath", f"{location}/{layout.COMPACTED}/{table}")
            frames.append(reader.parquet(*parts).select(*order))
        if not frames:
            self.session.sql(_empty(table, self.dialect)).createOrReplaceTempView(name)
            return False
        combined = frames[0]
        for frame in frames[1:]:
            combined = combined.unionAll(frame)
        combined.createOrReplaceTempView(name)
        return True

    def _read_text(self, location: str) -> str | None:
        from pyspark.errors import PySparkException

        try:
            rows = self.session.read.text(location, wholetext=True).collect()
        except PySparkException:
            return None
        return rows[0][0] if rows else None

    def sql(self, text: str) -> Any:
        from pyspark.errors import PySparkException

        try:
            for table in tables_named(text):
                self._register(table)
            registered = set(tables_named(text))
            while True:
                try:
                    return self.session.sql(text).toArrow()
                except PySparkException as error:
                    table = missing_table(str(error), registered)
                    if table is None:
                        raise
                    self._register(table)
                    registered.add(table)
        except PySparkException as error:
            raise QueryError(f"query failed (spark): {str(error).splitlines()[0]}") from None

    def close(self) -> None:
        pass  # the session is shared by the process


def engine(name: str, store: str, *, master: str | None = None, **options: Any) -> Engine:
    """``duckdb`` or ``spark`` over ``store``."""
    if name == "duckdb":
        if master:
            raise InvalidInputError("--master applies to --engine spark only")
        return DuckDBEngine(store, **options)
    if name == "spark":
        return SparkEngine(store, master=master, **options)
    raise InvalidInputError(f"unknown engine {name!r} (duckdb, spark)")
