"""Where DuckDB and Spark SQL differ, in one place.

The report SQL (``dfit_mlir/fleet/store/sql/*.sql``) is one text for both engines. It is written
in the subset they share, with these rules (each checked on both engines by
``tests/test_store_engines.py``):

* type names in casts are ``STRING``, ``INT``, ``BIGINT``, ``DOUBLE`` (DuckDB reads them as
  aliases); ``VARCHAR``/``HUGEINT`` are DuckDB-only;
* every ``SUM`` over integers is cast to ``BIGINT`` (DuckDB widens it to ``HUGEINT``, which
  reaches Arrow as a decimal; Spark keeps ``BIGINT``);
* every ``ORDER BY`` says ``NULLS LAST`` or ``NULLS FIRST`` (the defaults differ: DuckDB
  sorts nulls last, Spark first in ascending order);
* strings are joined with ``||`` (null if any part is; DuckDB's ``concat`` skips nulls,
  Spark's does not);
* JSON fields are read with Spark's ``get_json_object(text, '$.key')``; DuckDB gets a macro
  of that name (:data:`DUCKDB_PRELUDE`);
* ``median``, ``max_by``, ``count_if``, ``stddev_samp`` and ``greatest`` exist in both under these names;
* nothing is ``ROUND``ed: the engines round a double differently (``ROUND(17007157.95, 1)``),
  so reports return the doubles and ``dfit query`` rounds what it prints.

What cannot be written once is here: string literals (Spark reads backslash escapes in
them, DuckDB does not), column type names for the projections onto the store schema,
and the statements each engine runs first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: DuckDB statements run before any query: Spark's functions under Spark's names.
DUCKDB_PRELUDE: Final = (
    "CREATE OR REPLACE MACRO get_json_object(text, path) AS json_extract_string(text, path)",
)


@dataclass(frozen=True)
class Dialect:
    name: str
    types: dict[str, str]
    backslash_escapes: bool
    identifier_quote: str
    prelude: tuple[str, ...] = ()

    def identifier(self, name: str) -> str:
        return f"{self.identifier_quote}{name}{self.identifier_quote}"

    def literal(self, value: str | int | float | None) -> str:
        """``value`` as a SQL literal of this dialect."""
        if value is None:
            return "NULL"
        if isinstance(value, bool):
            return "TRUE" if value else "FALSE"
        if isinstance(value, (int, float)):
            return repr(value)
        text = value.replace("\\", "\\\\") if self.backslash_escapes else value
        return "'" + text.replace("'", "''") + "'"

    def type_name(self, portable: str) -> str:
        return self.types[portable]


DUCKDB: Final = Dialect(
    "duckdb",
    {"string": "VARCHAR", "int32": "INTEGER", "int64": "BIGINT", "float64": "DOUBLE", "list<string>": "VARCHAR[]"},
    backslash_escapes=False, identifier_quote='"', prelude=DUCKDB_PRELUDE)
SPARK: Final = Dialect(
    "spark",
    {"string": "STRING", "int32": "INT", "int64": "BIGINT", "float64": "DOUBLE", "list<string>": "ARRAY<STRING>"},
    backslash_escapes=True, identifier_quote='`')
