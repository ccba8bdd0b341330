"""Query engines over a store: DuckDB (in-process, the default) and Spark SQL (PySpark,
local or a cluster). Both expose every table of the store as a view with the current
schema's columns (columns an older minor lacks read as nulls) plus the Hive partition
keys, and return results as Arrow tables.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

from dfit_mlir.errors import DfitError, InvalidInputError
from dfit_mlir.store import dialects, layout


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


def _tables_present(store: str) -> list[str]:
    if "://" in store:
        return list(layout.TABLES)
    base = Path(store) / layout.BUNDLES
    if not any(base.glob(f"*/*/*/{layout.TABLES[-1]}.parquet")):
        raise InvalidInputError(f"{store}: the store holds no bundles yet (add some with `dfit collect`)")
    return list(layout.TABLES)


class DuckDBEngine:
    """DuckDB over the Parquet files where they are (nothing is loaded up front)."""

    dialect = dialects.DUCKDB

    def __init__(self, store: str, *, threads: int | None = None, memory_limit: str | None = None):
        import duckdb

        config: dict[str, Any] = {}
        if threads:
            config["threads"] = threads
        if memory_limit:
            config["memory_limit"] = memory_limit
        self.connection = duckdb.connect(config=config)
        for statement in self.dialect.prelude:
            self.connection.execute(statement)
        hive_types = "{" + ", ".join(f"'{key}': 'VARCHAR'" for key in layout.PARTITION_KEYS) + "}"
        for table in _tables_present(store):
            source = (f"read_parquet({self.dialect.literal(layout.table_glob(store, table))}, hive_partitioning=true, "
                      f"union_by_name=true, hive_types={hive_types})")
            present = {row[0] for row in self.connection.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}
            self.connection.execute(f"CREATE VIEW {table} AS SELECT {', '.join(_projection(table, present, self.dialect))} "
                                    f"FROM {source}")

    def sql(self, text: str) -> Any:
        import duckdb

        try:
            relation = self.connection.sql(text)
            if relation is None:  # a statement, not a query
                import pyarrow as pa

                return pa.table({})
            return relation.to_arrow_table()
        except duckdb.Error as error:
            raise QueryError(f"query failed (duckdb): {str(error).splitlines()[0]}") from None

    def close(self) -> None:
        self.connection.close()


_SPARK_SESSION: Any = None
#: Store → the bundle listing its views were registered for (one SparkSession per process).
_SPARK_VIEWS: dict[str, tuple[str, ...] | None] = {}


def _listing(store: str) -> tuple[str, ...] | None:
    if "://" in store:
        return None  # object stores: register again each time
    return tuple(str(path) for path in layout.bundle_dirs(Path(store)))


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
    """Spark SQL over the same store path (a local directory, or an s3a:// / hdfs:// URL)."""

    dialect = dialects.SPARK

    def __init__(self, store: str, *, master: str | None = None):
        self.session = spark_session(master)
        base = f"{store.rstrip('/')}/{layout.BUNDLES}"
        listing = _listing(store)
        if _SPARK_VIEWS.get(store) == listing and listing is not None:
            return  # the views of this store are registered and its bundles have not changed
        for table in _tables_present(store):
            # The store's schema, given: no inference job, and columns an older minor's
            # files lack read as nulls.
            schema = ", ".join([f"`{key}` STRING" for key in layout.PARTITION_KEYS] +
                               [f"`{name}` {self.dialect.type_name(kind)}" for name, kind in layout.table_columns(table)])
            frame = (self.session.read.schema(schema).option("basePath", base)
                     .parquet(layout.table_glob(store, table)))
            frame.createOrReplaceTempView(table)
        _SPARK_VIEWS[store] = listing

    def sql(self, text: str) -> Any:
        from pyspark.errors import PySparkException

        try:
            return self.session.sql(text).toArrow()
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
        return SparkEngine(store, master=master)
    raise InvalidInputError(f"unknown engine {name!r} (duckdb, spark)")
