"""Query engines over a store: DuckDB (in-process, the default) and Spark SQL (PySpark,
local or a cluster). Both expose every table of the store as a view with the current
schema's columns (columns an older minor lacks read as nulls) plus the Hive partition
keys, and return results as Arrow tables.

A table's view is set up the first time a query reads it (setting one up reads the
footer of each of its files). It is the union of the bundle directories' files and the
compacted parts the index lists (:mod:`dfit_mlir.fleet.store.compact`; a run is read from one
or the other, never both); the rollup ``op_totals`` adds the rows computed from
``events`` for bundles that have no such file (layout 1.0), or is computed from
``events`` entirely with ``use_rollups=False``. ``op_ledger`` (the ledger's entries,
layout 1.2) cannot be computed from the store: a local store holding a bundle collected
without it is refused, naming the bundle (:func:`check_ledger`).

Every query either engine runs — the user's text, a named report, the checks dfit makes
— goes through the read-only policy of :mod:`dfit_mlir.fleet.store.policy` first, and runs
where SIGINT / SIGTERM cancel it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Final, Protocol

from dfit_mlir.core.errors import DfitError, InvalidInputError, QueryError, ToolchainError
from dfit_mlir.fleet.store import dialects, layout, policy, rollup


class EngineError(ToolchainError):
    """The engine itself failed (Spark could not start or reach its master, a storage
    scheme it cannot read): exit 3, one line, the Java stack kept off the terminal."""


#: Rows per Arrow record batch when a result is streamed to a file (a Parquet row group
#: each): 18M events stream at 13 s with 512Ki-row batches, 24 s with 64Ki, in the same
#: ~280 MB.
STREAM_ROWS = 1 << 19
#: Spark's rows reach Python one by one (``toLocalIterator``): fewer per batch.
SPARK_STREAM_ROWS = 1 << 16


class Engine(Protocol):
    dialect: dialects.Dialect

    def sql(self, text: str) -> Any: ...

    def head(self, text: str, rows: int) -> Any: ...

    def stream(self, text: str) -> Any: ...

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

        text = read_text(f"{self.location.rstrip('/')}/{layout.COMPACTED}/{layout.INDEX_FILE}")
        if text:
            from dfit_mlir.core import reading

            document = reading.parse_json(text, f"{self.location.rstrip('/')}/{layout.COMPACTED}/{layout.INDEX_FILE}")
            if isinstance(document, dict) and document.get("schema") == layout.INDEX_SCHEMA:
                layout.check_index(document, None, f"{self.location}/{layout.COMPACTED}/{layout.INDEX_FILE}")
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


def check_ledger(files: _StoreFiles) -> None:
    """Refuse (one line naming the bundle) a local store holding a bundle an older layout
    collected without ``op_ledger``: its rows need the bundle's manifest and events,
    which the store does not keep, so they cannot be computed at read time. A URL
    store is not listed: its bundles are read as they are."""
    if not files.local:
        return
    for path in files.dirs:
        run = _run(path)
        if files.in_parts(run, layout.LEDGER_TABLE) or (path / f"{layout.LEDGER_TABLE}.parquet").is_file():
            continue
        if run in files.index["runs"] or (path / f"{layout.RUNS_TABLE}.parquet").is_file():
            raise InvalidInputError(
                f"{path}: collected by an older store layout, without the ledger table {layout.LEDGER_TABLE} "
                f"(each op's share of its dispatch's time, what top-sites and regressions read); collect "
                f"{_collected_from(path)} into {files.location} again to add it")


def _collected_from(bundle: Path) -> str:
    """The bundle a stored one was collected from (its ``runs`` row), for a message."""
    try:
        import pyarrow.parquet as pq

        sources = pq.read_table(bundle / f"{layout.RUNS_TABLE}.parquet", columns=["source"]).column("source")
        return str(sources[0].as_py()) if len(sources) and sources[0].as_py() else "its bundle"
    except (OSError, ValueError, KeyError):
        return "its bundle"


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

    def __init__(self, store: str, *, threads: int | None = None, memory_limit: str | int | None = None,
                 use_rollups: bool = True):
        duckdb = layout.require("duckdb")

        self.limits = policy.limits(threads, memory_limit)
        self.files = _StoreFiles(store, use_rollups=use_rollups)
        try:
            # The store's files and nothing else; nothing downloaded or loaded on its own
            # (a URL store needs httpfs installed beforehand).
            self.connection = policy.duckdb_connection(self.files.location, self.limits, self.dialect.prelude)
        except duckdb.Error as error:
            _missing_extension(str(error), self.files.location)
            raise EngineError(f"{store}: duckdb cannot open it: {str(error).splitlines()[0]}") from None
        self.views: set[str] = set()
        if not self.files.local:
            self.files.read_remote_index(self._read_text)

    def _read_text(self, location: str) -> str | None:
        try:
            text = "SELECT content FROM read_text(?)"
            policy.check_duckdb(text)
            rows = self.connection.execute(text, [location]).fetchall()
        except self.errors():
            return None
        return rows[0][0] if rows else None

    def _register(self, table: str) -> None:
        if table in self.views:
            return
        if table == layout.LEDGER_TABLE:
            check_ledger(self.files)
        if table in layout.ROLLUP_TABLES:
            self.connection.execute(f"CREATE VIEW {table} AS {_rollup_body(self, table)}")
        else:
            self._register_files(table, table)
        self.views.add(table)

    def _rows(self, text: str) -> list[tuple[Any, ...]]:
        policy.check_duckdb(text)
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
            except self.errors() as error:
                _missing_extension(str(error), self.files.location)
                if bundle_files is None:  # a URL store whose bundles are all compacted: no file matches
                    continue
                raise
            where = (" WHERE run NOT IN (" + ", ".join(self.dialect.literal(run) for run in excluded) + ")"
                     if excluded else "")
            selects.append(f"SELECT {', '.join(_projection(table, present, self.dialect))} FROM {source}{where}")
        self.connection.execute(f"CREATE VIEW {name} AS {' UNION ALL '.join(selects) or _empty(table, self.dialect)}")
        return bool(selects)

    def _relation(self, text: str) -> Any:
        import duckdb

        policy.check_duckdb(text)
        for table in tables_named(text):
            self._register(table)
        while True:
            try:
                return self.connection.sql(text)
            except duckdb.CatalogException as error:
                table = missing_table(str(error), self.views)
                if table is None:
                    raise
                self._register(table)

    def _reader(self, text: str, rows: int) -> Any:
        """A RecordBatchReader over ``text``'s rows: DuckDB computes them as they are read."""
        import pyarrow as pa

        relation = self._relation(text)
        if relation is None:  # a statement, not a query
            return pa.RecordBatchReader.from_batches(pa.schema([]), [])
        return relation.to_arrow_reader(rows)

    def _run(self, produce: Any) -> Any:
        """``produce()`` where a signal cancels it, DuckDB's errors as dfit's lines."""
        import duckdb

        try:
            return policy.interruptible(produce, self.connection.interrupt)
        except duckdb.InterruptException:
            raise KeyboardInterrupt from None
        except duckdb.OutOfMemoryException as error:
            raise policy.ResourceError(f"query failed (duckdb): it needs more memory than --memory-limit "
                                       f"{self.limits.memory_text} gives it ({str(error).splitlines()[0]})") from None
        except duckdb.Error as error:
            refused = policy.duckdb_refusal(error)
            if refused is not None:
                raise refused from None
            if not self.files.local:
                _missing_extension(str(error), self.files.location)
            raise QueryError(f"query failed (duckdb): {str(error).splitlines()[0]}") from None

    def sql(self, text: str) -> Any:
        return self._run(lambda: self._reader(text, STREAM_ROWS).read_all())

    def head(self, text: str, rows: int) -> Any:
        """The first ``rows`` rows only (the rest is never computed when DuckDB can stop)."""
        import pyarrow as pa

        def first() -> Any:
            reader = self._reader(text, max(rows, 1))
            kept, count = [], 0
            for batch in reader:
                kept.append(batch.slice(0, rows - count))
                count += kept[-1].num_rows
                if count >= rows:
                    break
            return pa.Table.from_batches(kept, schema=reader.schema)

        return self._run(first)

    def stream(self, text: str) -> Any:
        """(schema, batches) of ``text``'s rows in bounded memory; errors while reading
        them are raised as :class:`QueryError` too."""
        reader = self._run(lambda: self._reader(text, STREAM_ROWS))

        def batches() -> Any:
            iterator = iter(reader)
            while True:
                batch = self._run(lambda: next(iterator, None))
                if batch is None:
                    return
                yield batch

        return reader.schema, batches()

    def close(self) -> None:
        import duckdb

        try:
            self.connection.close()
        except duckdb.Error:  # a query cancelled by a signal that has not stopped yet: dfit exits anyway
            pass


def _missing_extension(message: str, location: str) -> None:
    """DuckDB needing an extension it may not download (exit 3, what to do instead)."""
    lowered = message.lower()
    if "extension" in lowered and ("autoload" in lowered or "install" in lowered or "not loaded" in lowered):
        scheme = location.split("://", 1)[0] if "://" in location else "this"
        raise EngineError(f"{location}: DuckDB needs its httpfs extension to read {scheme}:// and dfit does not "
                          "download at run time (install it beforehand: python -c \"import duckdb; "
                          "duckdb.install_extension('httpfs')\", or use --engine spark)")


#: Spark master URLs (https://spark.apache.org/docs/latest/submitting-applications.html#master-urls).
_MASTER = re.compile(r"local(\[(\*|\d+)(,\s*\d+)?\])?|local-cluster\[\d+,\s*\d+,\s*\d+\]"
                     r"|spark://[^/\s:]+:\d+(,[^/\s:]+:\d+)*|yarn|k8s://\S+|mesos://\S+|connect://\S+")
#: Seconds to wait for a standalone master to accept a connection before Spark is started.
MASTER_CONNECT_TIMEOUT_S = 5.0


def check_master(master: str) -> None:
    """A bad master URL is refused (exit 2), an unreachable standalone master fails fast
    (exit 3) instead of Spark retrying its registration for a minute."""
    import socket

    if not _MASTER.fullmatch(master.strip()):
        raise InvalidInputError(f"--master {master!r} is not a Spark master URL (local[N], spark://HOST:PORT, "
                                "yarn, k8s://URL)")
    if not master.startswith("spark://"):
        return
    for address in master[len("spark://"):].split(","):
        host, port = address.rsplit(":", 1)
        try:
            with socket.create_connection((host, int(port)), timeout=MASTER_CONNECT_TIMEOUT_S):
                return
        except OSError as error:
            reason = error.strerror or type(error).__name__
    raise EngineError(f"--master {master}: no Spark master answers there ({reason})")


_SPARK_SESSION: Any = None
#: The session's warehouse and local directories' parent (:func:`_spark_scratch`).
_SPARK_SCRATCH: Path | None = None
#: (store, table) → the bundle listing and rollup use its view was registered for (one
#: SparkSession per process).
_SPARK_VIEWS: dict[tuple[str, str], tuple[tuple[str, ...] | None, bool]] = {}


def spark_session(master: str | None = None, limits: policy.Limits | None = None) -> Any:
    """One SparkSession per process (Spark allows one active context); quiet, UTC, with
    partition values read as strings like DuckDB reads them. Locally it runs with
    ``limits`` (cores, driver memory: fixed when the JVM starts, so the first session's
    stand); its warehouse and scratch directories are a temporary folder of dfit's, never
    the store nor the working directory."""
    global _SPARK_SESSION
    if _SPARK_SESSION is not None:
        return _SPARK_SESSION
    os.environ.setdefault("PYSPARK_PYTHON", _python())
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no "hostname resolves to loopback" warning
    from importlib import resources

    layout.require("pyspark")
    from pyspark.sql import SparkSession

    log_config = resources.files("dfit_mlir.fleet.store").joinpath("log4j2.properties")

    limits = limits or policy.limits()
    master = master or os.environ.get("DFIT_SPARK_MASTER", f"local[{limits.threads}]")
    check_master(master)
    scratch = _spark_scratch()
    builder = (SparkSession.builder.appName("dfit-query")
               .master(master)
               .config("spark.driver.memory", f"{max(limits.memory_bytes >> 20, 512)}m")
               .config("spark.sql.warehouse.dir", str(scratch / "warehouse"))
               .config("spark.local.dir", str(scratch / "local"))
               .config("spark.sql.catalogImplementation", "in-memory")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
               .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log_config}")
               .config("spark.sql.ansi.enabled", "false"))
    try:
        session = builder.getOrCreate()
    except Exception as error:  # noqa: BLE001 — py4j / Java / gateway start failures alike
        raise EngineError(f"spark: cannot start a session at {master}: {_first_line(error)}") from None
    session.sparkContext.setLogLevel("ERROR")
    _SPARK_SESSION = session
    return session


#: Spark's scratch folders: ``$TMPDIR/dfit-spark-<pid>-*`` (:func:`paths.private_prefix`).
SPARK_SCRATCH_PREFIX = "dfit-spark-"


def _spark_scratch() -> Path:
    """A temporary folder for Spark's warehouse and local files, removed when dfit exits
    (a store it lies in is refused: :meth:`SparkEngine.__init__`). Named after this
    process, so that the next session removes what a killed dfit left (no ``atexit``
    runs after a SIGKILL, and Spark's shuffle files can be large)."""
    import atexit
    import shutil
    import tempfile

    from dfit_mlir.core import paths

    global _SPARK_SCRATCH
    paths.remove_stale_folders(Path(tempfile.gettempdir()), (SPARK_SCRATCH_PREFIX,))
    scratch = Path(tempfile.mkdtemp(prefix=paths.private_prefix(SPARK_SCRATCH_PREFIX)))
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    _SPARK_SCRATCH = scratch
    return scratch


def _first_line(error: BaseException) -> str:
    """The Java exception's own message, not its stack (a Py4JJavaError's str is the stack)."""
    java = getattr(error, "java_exception", None)
    if java is not None:
        try:
            return f"{java.getClass().getName()}: {java.getMessage()}".splitlines()[0]
        except Exception:  # noqa: BLE001 — the gateway itself may be gone
            pass
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:
        if "Exception" in line or "Error" in line:
            return line[:300]
    return (lines[0] if lines else type(error).__name__)[:300]


def _java_message(error: BaseException) -> str:
    java = getattr(error, "java_exception", None)
    try:
        return str(java.getMessage()) if java is not None else str(error)
    except Exception:  # noqa: BLE001 — the gateway itself may be gone
        return str(error)


def _python() -> str:
    import sys

    return sys.executable


class SparkEngine:
    """Spark SQL over the same store path (a local directory, or an s3a:// / hdfs:// URL);
    a table's view is registered the first time a query names it."""

    dialect = dialects.SPARK

    def __init__(self, store: str, *, master: str | None = None, threads: int | None = None,
                 memory_limit: str | int | None = None, use_rollups: bool = True):
        self.limits = limits = policy.limits(threads, memory_limit)
        self.files = _StoreFiles(store, use_rollups=use_rollups)
        self.session = spark_session(master, limits)
        if self.files.local and _SPARK_SCRATCH is not None and policy.under_store(str(_SPARK_SCRATCH), store):
            raise InvalidInputError(f"{store}: Spark's scratch folder {_SPARK_SCRATCH} (under $TMPDIR) lies in the "
                                    "store; set TMPDIR to a folder outside it")
        self.scope = policy.SparkScope(self.files.location, frozenset(
            [*layout.TABLES, *(f"{table}_files" for table in layout.ROLLUP_TABLES)]))
        if not self.files.local:
            self.files.read_remote_index(self._read_text)

    def _register(self, table: str) -> None:
        store = self.files.location
        listing = self.files.listing()
        registered = (listing, self.files.use_rollups)
        if listing is not None and _SPARK_VIEWS.get((store, table)) == registered:
            return  # registered for this store, and its bundles have not changed
        if table == layout.LEDGER_TABLE:
            check_ledger(self.files)
        if table in layout.ROLLUP_TABLES:
            self.session.sql(f"CREATE OR REPLACE TEMP VIEW {table} AS {_rollup_body(self, table)}")
        else:
            self._register_files(table, table)
        _SPARK_VIEWS[(store, table)] = registered

    def _rows(self, text: str) -> list[tuple[Any, ...]]:
        self._check(text)
        return [tuple(row) for row in self.session.sql(text).collect()]

    def _check(self, text: str) -> None:
        """The policy's check, Spark's syntax errors as one line naming the token."""
        from pyspark.errors import ParseException

        try:
            policy.check_spark(self.session._jsparkSession.sessionState().sqlParser(), text, self.scope)
        except ParseException as error:
            raise QueryError(f"query failed (spark): {policy.spark_syntax_error(str(error))}") from None
        except Exception as error:
            # py4j hands the parser's exception over as a Py4JJavaError
            if "ParseException" in type(error).__name__ or "ParseException" in _first_line(error):
                raise QueryError(f"query failed (spark): {policy.spark_syntax_error(_java_message(error))}") \
                    from None
            raise

    def _cancel(self) -> None:
        self.session.sparkContext.cancelAllJobs()

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
        from py4j.protocol import Py4JError
        from pyspark.errors import PySparkException

        try:
            rows = self.session.read.text(location, wholetext=True).collect()
        except (PySparkException, Py4JError) as error:
            if _storage_failure(str(error)):
                raise EngineError(f"{self.files.location}: spark cannot read it: {_first_line(error)}"
                                  f"{_storage_hint(str(error))}") from None
            return None
        return rows[0][0] if rows else None

    def _frame(self, text: str, finish: Any) -> Any:
        self._check(text)
        return policy.interruptible(lambda: self._finish(text, finish), self._cancel)

    def _finish(self, text: str, finish: Any) -> Any:
        from py4j.protocol import Py4JError
        from pyspark.errors import PySparkException

        try:
            for table in tables_named(text):
                self._register(table)
            registered = set(tables_named(text))
            while True:
                try:
                    return finish(self.session.sql(text))
                except PySparkException as error:
                    table = missing_table(str(error), registered)
                    if table is None:
                        raise
                    self._register(table)
                    registered.add(table)
        except (PySparkException, Py4JError) as error:
            raise self._failure(error) from None

    def _failure(self, error: Exception) -> DfitError:
        """A Spark exception as one line: the query's fault (exit 2), else the engine's (3)."""
        from pyspark.errors import PySparkException

        if _storage_failure(str(error)):
            return EngineError(f"{self.files.location}: spark cannot read it: {_first_line(error)}"
                               f"{_storage_hint(str(error))}")
        if "OutOfMemoryError" in str(error):
            return policy.ResourceError(f"query failed (spark): it needs more memory than the driver's "
                                        f"{self.limits.memory_text} (--memory-limit) gives it")
        if isinstance(error, PySparkException):
            return QueryError(f"query failed (spark): {policy.spark_syntax_error(str(error))}")
        # A Java failure PySpark has no class for (a lost executor, the gateway gone).
        return EngineError(f"spark failed on {self.files.location}: {_first_line(error)}")

    def sql(self, text: str) -> Any:
        return self._frame(text, lambda frame: frame.toArrow())

    def head(self, text: str, rows: int) -> Any:
        return self._frame(text, lambda frame: frame.limit(rows).toArrow())

    def stream(self, text: str) -> Any:
        """(schema, batches): rows come to the driver a partition at a time
        (``toLocalIterator``), made into Arrow batches of :data:`SPARK_STREAM_ROWS`."""
        import pyarrow as pa

        schema = self._frame(text, lambda frame: frame.limit(0).toArrow()).schema

        def batches() -> Any:
            from py4j.protocol import Py4JError
            from pyspark.errors import PySparkException

            iterator = self._frame(text, lambda frame: frame.toLocalIterator(prefetchPartitions=False))

            def next_rows() -> list[dict[str, Any]]:
                rows = []
                for row in iterator:
                    rows.append(row.asDict(recursive=True))
                    if len(rows) >= SPARK_STREAM_ROWS:
                        break
                return rows

            while True:
                try:
                    rows = policy.interruptible(next_rows, self._cancel)
                except (PySparkException, Py4JError) as error:
                    raise self._failure(error) from None
                if not rows:
                    return
                yield pa.RecordBatch.from_pylist(rows, schema=schema)

        return schema, batches()

    def close(self) -> None:
        pass  # the session is shared by the process


def _storage_failure(message: str) -> bool:
    lowered = message.lower()
    return "no filesystem for scheme" in lowered or "classnotfoundexception" in lowered and "filesystem" in lowered


def _storage_hint(message: str) -> str:
    if "S3AFileSystem" in message:
        return " (s3a:// needs hadoop-aws on Spark's classpath: spark.jars.packages org.apache.hadoop:hadoop-aws)"
    return ""


#: Store URL schemes each engine can read (DuckDB's through its httpfs extension).
URL_SCHEMES: Final = {"duckdb": ("file", "s3", "s3a", "s3n", "gs", "gcs", "r2", "http", "https", "az", "abfss", "hf"),
                      "spark": ("s3a", "s3", "s3n", "hdfs", "gs", "abfs", "abfss", "wasb", "wasbs", "viewfs",
                                "file", "oss", "cos", "obs")}


def check_url(name: str, store: str) -> None:
    """A store URL of a scheme the engine cannot read: exit 2 before the engine starts."""
    scheme, _, rest = store.partition("://")
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme) or not rest.strip("/"):
        raise InvalidInputError(f"{store}: not a store URL (SCHEME://BUCKET/PATH) nor a local directory")
    if scheme.lower() not in URL_SCHEMES.get(name, ()):
        raise InvalidInputError(f"{store}: --engine {name} reads no {scheme}:// store "
                                f"({', '.join(s + '://' for s in URL_SCHEMES[name])})")


def engine(name: str, store: str, *, master: str | None = None, **options: Any) -> Engine:
    """``duckdb`` or ``spark`` over ``store``."""
    if "://" in store and name in URL_SCHEMES:
        check_url(name, store)
    if name == "duckdb":
        if master:
            raise InvalidInputError("--master applies to --engine spark only")
        return DuckDBEngine(store, **options)
    if name == "spark":
        return SparkEngine(store, master=master, **options)
    raise InvalidInputError(f"unknown engine {name!r} (duckdb, spark)")
