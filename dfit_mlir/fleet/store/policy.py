"""The read-only policy of ``dfit query``: the SQL it is handed reads the store and
nothing else, on either engine, with resources dfit sets (never the SQL).

One policy, two layers:

* **the engine enforces what it can**: DuckDB's connection sees the store's files and no
  other (``enable_external_access = false`` with the store as the one allowed directory),
  loads no extension, spills nothing to disk, runs with dfit's ``threads`` and
  ``memory_limit``, and its configuration is locked before any query runs. Spark's
  warehouse and scratch directories are dfit's own temporary folder (never the store, nor
  the working directory), its cores and memory dfit's.
* **dfit checks what the engine cannot**: the text is parsed first and one statement of a
  query kind runs (DuckDB: the parser's statement type; Spark: the node classes of the
  parsed, unresolved logical plan, subqueries and the plans EXPLAIN/DESCRIBE name
  included); a relation read by path (Spark's ``parquet.`PATH```) lies under the store;
  no table function or function reads files or calls Java.

Named reports, the label checks and every query dfit itself runs go through the same
checks (:func:`check_duckdb`, :func:`check_spark`). A refusal is :class:`QueryRefused`:
exit 2, one line naming what was refused and why, before anything is read or written.

A user who wants SQL beyond this (writes, other files, extensions) opens the store's
Parquet files with DuckDB or Spark directly (README, "Many runs").
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from dfit_mlir.core.errors import DfitError, InvalidInputError, ToolchainError

READS_ONLY: Final = "dfit query only reads the store"


class QueryRefused(DfitError):
    """A statement the read-only policy does not run: exit 2, nothing read or written."""

    exit_code = 2

    def __init__(self, what: str, hint: str = ""):
        super().__init__(f"query refused: {what}; {READS_ONLY}{f' ({hint})' if hint else ''}")


class ResourceError(ToolchainError):
    """A query that needs more memory than ``--memory-limit`` gives it: exit 3."""


# --- resources: dfit's options, never SQL settings ---------------------------------------

_SIZE: Final = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)\s*", re.IGNORECASE)
_UNITS: Final = {"": 1, "B": 1, "K": 1000, "KB": 1000, "M": 1000**2, "MB": 1000**2, "G": 1000**3, "GB": 1000**3,
                 "T": 1000**4, "TB": 1000**4, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40}
#: Below this DuckDB cannot run a scan of a store's footers at all.
MIN_MEMORY_BYTES: Final = 32 * 1000**2


@dataclass(frozen=True)
class Limits:
    """Threads and memory a query runs with (DuckDB's connection; Spark's local session)."""

    threads: int
    memory_bytes: int

    @property
    def memory_text(self) -> str:
        return f"{self.memory_bytes / 1000**3:.3g}GB" if self.memory_bytes >= 1000**3 else \
            f"{self.memory_bytes / 1000**2:.4g}MB"


def machine_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def machine_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 4 * 1000**3


def parse_size(text: str, option: str = "--memory-limit") -> int:
    """``4GB``, ``512MiB``, ``2g`` → bytes (exit 2 naming the option otherwise)."""
    match = _SIZE.fullmatch(text)
    unit = match.group(2).upper() if match else ""
    if match is None or unit not in _UNITS:
        raise InvalidInputError(f"{option} {text!r} is not a size (e.g. 4GB, 512MB, 2GiB)")
    return int(float(match.group(1)) * _UNITS[unit])


def limits(threads: int | None = None, memory_limit: str | int | None = None) -> Limits:
    """dfit's resource options, checked; defaults sized to the machine (every core it may
    use, half its memory: the rest is left to the result in Python and to the system)."""
    cores, memory = machine_cores(), machine_memory()
    if threads is None:
        threads = cores
    if not isinstance(threads, int) or isinstance(threads, bool) or not 1 <= threads <= cores:
        raise InvalidInputError(f"--threads {threads!r}: give 1 to {cores} (the CPUs this machine lets dfit use)")
    wanted = memory // 2 if memory_limit is None else (
        memory_limit if isinstance(memory_limit, int) else parse_size(str(memory_limit)))
    if not MIN_MEMORY_BYTES <= wanted <= memory:
        raise InvalidInputError(f"--memory-limit {memory_limit}: give {MIN_MEMORY_BYTES // 1000**2}MB to "
                                f"{memory / 1000**3:.3g}GB (this machine's memory)")
    return Limits(threads, wanted)


# --- cancellation: SIGINT / SIGTERM stop the engine's work, then exit 130 -----------------

#: Seconds a cancelled query gets to stop before dfit exits without it.
CANCEL_WAIT_S: Final = 10.0
CANCEL_POLL_S: Final = 0.05


def interruptible(work: Callable[[], Any], cancel: Callable[[], Any]) -> Any:
    """``work()`` in a worker thread while the main thread waits where a signal can reach
    it: SIGINT / SIGTERM (a KeyboardInterrupt there, see ``dfit_mlir.core.atomic.on_signal``)
    call ``cancel()`` (DuckDB ``interrupt()``, Spark ``cancelAllJobs``), wait for the
    engine to stop and re-raise. An engine call in the main thread would hold the signal
    until it returns (or turn it into its own error)."""
    if threading.current_thread() is not threading.main_thread():
        return work()
    outcome: dict[str, Any] = {}
    finished = threading.Event()

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as error:  # noqa: BLE001 — handed to the main thread as it is
            outcome["error"] = error
        finally:
            finished.set()

    threading.Thread(target=run, name="dfit-query", daemon=True).start()
    try:
        while not finished.wait(1.0):
            pass
    except KeyboardInterrupt:
        # Again and again: a cancel that lands between two engine calls stops nothing.
        deadline = time.monotonic() + CANCEL_WAIT_S
        while time.monotonic() < deadline:
            try:
                cancel()
            except Exception:  # noqa: BLE001 — the engine may be gone already; we exit anyway
                break
            if finished.wait(CANCEL_POLL_S):
                break
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


# --- the text: comments, emptiness, the first keyword ------------------------------------

def _code(text: str, backslash_escapes: bool) -> str:
    """``text`` with comments removed and string literals blanked (what keywords and
    semicolons are found in)."""
    out, k, n = [], 0, len(text)
    while k < n:
        c = text[k]
        if text.startswith("--", k):
            k = text.find("\n", k)
            k = n if k < 0 else k
        elif text.startswith("/*", k):
            end = text.find("*/", k + 2)
            k = n if end < 0 else end + 2
            out.append(" ")
        elif c in "'\"`":
            end = k + 1
            while end < n and text[end] != c:
                end += 2 if backslash_escapes and c != "`" and text[end] == "\\" else 1
            out.append(c + " " + c)
            k = end + 1
        else:
            out.append(c)
            k += 1
    return "".join(out)


def first_keyword(text: str, backslash_escapes: bool = False) -> str:
    match = re.search(r"[A-Za-z_]+", _code(text, backslash_escapes))
    return match.group(0).upper() if match else ""


def check_not_empty(text: str, backslash_escapes: bool = False) -> None:
    if not _code(text, backslash_escapes).replace(";", " ").strip():
        raise InvalidInputError("empty query: the text holds only comments or semicolons (give one SQL statement "
                                "or a report name)")


# --- DuckDB ---------------------------------------------------------------------------

_SAVE_HINT: Final = "use -o to save a result"
_SETTINGS_HINT: Final = "threads and memory are dfit's --threads and --memory-limit"
_RAW_HINT: Final = "for other files, open them with DuckDB or Spark yourself"

#: Statement types refused → (why, hint); the name said is the statement's first keyword.
DUCKDB_REFUSED: Final = {
    "COPY": ("writes files", _SAVE_HINT), "EXPORT": ("writes files", _SAVE_HINT),
    "COPY_DATABASE": ("writes a database", _SAVE_HINT),
    "ATTACH": ("opens another database", _RAW_HINT), "DETACH": ("changes the attached databases", ""),
    "LOAD": ("installs or loads an extension", _RAW_HINT), "EXTENSION": ("changes extensions", _RAW_HINT),
    "SET": ("changes the session's settings", _SETTINGS_HINT),
    "VARIABLE_SET": ("changes the session's settings", _SETTINGS_HINT),
    "PRAGMA": ("runs a pragma (settings, imports)", _SETTINGS_HINT), "CALL": ("runs a procedure", ""),
    "CREATE": ("defines objects", _RAW_HINT), "INSERT": ("writes tables", _RAW_HINT),
    "UPDATE": ("writes tables", _RAW_HINT), "DELETE": ("writes tables", _RAW_HINT),
    "MERGE_INTO": ("writes tables", _RAW_HINT), "DROP": ("drops objects", ""), "ALTER": ("alters objects", ""),
    "TRANSACTION": ("is a transaction statement", ""), "VACUUM": ("rewrites storage", ""),
    "ANALYZE": ("rewrites statistics", ""), "PREPARE": ("prepares statements to run later", ""),
    "EXECUTE": ("runs a prepared statement", ""),
}
#: EXPLAIN's options before the statement it explains.
_EXPLAIN: Final = re.compile(r"\s*EXPLAIN\s+(?:ANALY[SZ]E\s+)?(?:\([^)]*\)\s*)?", re.IGNORECASE)


def check_duckdb(text: str) -> None:
    """``text`` is one DuckDB statement of a query kind (SELECT, WITH, VALUES, FROM,
    DESCRIBE, SHOW, SUMMARIZE, PIVOT / UNPIVOT, EXPLAIN of one of these), else refused."""
    import duckdb

    from dfit_mlir.core.errors import QueryError

    check_not_empty(text)
    try:
        statements = duckdb.extract_statements(text)
        kinds = [statement.type.name for statement in statements]
    except duckdb.Error as error:
        raise QueryError(f"query failed (duckdb): {str(error).splitlines()[0]}") from None
    except ValueError:  # a statement type the Python client has no name for (UPDATE EXTENSIONS)
        raise QueryRefused(f"{first_keyword(text)} is not a query", _RAW_HINT) from None
    if not statements:
        check_not_empty("")
    if len(statements) > 1:
        raise QueryRefused(f"{len(statements)} statements in one text (one statement per query)")
    [statement], [kind] = statements, kinds
    keyword = first_keyword(statement.query)
    if kind == "SELECT" or (kind == "MULTI" and keyword in ("PIVOT", "UNPIVOT")):
        return
    if kind == "EXPLAIN":
        try:
            check_duckdb(_explained(statement.query))
        except QueryRefused as refused:
            raise QueryRefused("EXPLAIN of " + str(refused).split(": ", 1)[1].split(";")[0]) from None
        return
    why, hint = DUCKDB_REFUSED.get(kind, ("is not a query", ""))
    raise QueryRefused(f"{keyword or kind} {why}", hint)


def _explained(text: str) -> str:
    """The statement an EXPLAIN names (the comments before it left out)."""
    rest = text
    while True:
        rest = rest.lstrip()
        if rest.startswith("--"):
            rest = rest.split("\n", 1)[1] if "\n" in rest else ""
        elif rest.startswith("/*") and "*/" in rest:
            rest = rest.split("*/", 1)[1]
        else:
            break
    match = _EXPLAIN.match(rest)
    return rest[match.end():] if match else rest


def duckdb_connection(location: str, limits_: Limits, prelude: tuple[str, ...] = ()) -> Any:
    """A DuckDB connection that sees the files under ``location`` and nothing else, with
    ``limits_``, its configuration locked. ``prelude``: statements dfit runs first (its
    macros). A URL store needs the httpfs extension installed beforehand (nothing is
    downloaded, nothing loads on its own)."""
    import duckdb

    connection = duckdb.connect(config={
        "threads": limits_.threads, "memory_limit": f"{limits_.memory_bytes // 1000}KB",
        # No spilling: a query bigger than its memory fails (exit 3) instead of filling a
        # disk or writing temporary files into the working directory.
        "temp_directory": "",
        "autoload_known_extensions": False, "autoinstall_known_extensions": False,
        "allow_community_extensions": False, "allow_unsigned_extensions": False,
    })
    try:
        connection.execute("SET parquet_metadata_cache = true")  # footers read once per connection
        for statement in prelude:
            connection.execute(statement)
        if "://" in location and not location.lower().startswith("file://"):
            connection.execute("LOAD httpfs")
        allowed = store_prefixes(location)
        connection.execute("SET allowed_directories = " + "[" + ", ".join(_quoted(p) for p in allowed) + "]")
        connection.execute("SET enable_external_access = false")
        connection.execute("SET lock_configuration = true")
    except BaseException:
        connection.close()
        raise
    return connection


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def store_prefixes(location: str) -> list[str]:
    """The store as directory prefixes (``/…/store/``): as given, absolute, and with
    symlinks resolved (an engine may be handed any of them)."""
    if location.lower().startswith("file://"):  # DuckDB reads it as the local path too
        return [location.rstrip("/") + "/", *store_prefixes(location[len("file://"):] or "/")]
    if "://" in location:
        return [location.rstrip("/") + "/"]
    found = [os.path.abspath(location), os.path.realpath(location)]
    return [path.rstrip("/") + "/" for path in dict.fromkeys(found)]


def duckdb_refusal(error: Exception) -> QueryRefused | None:
    """DuckDB's own refusal (a file outside the store, an extension) as dfit's line."""
    import duckdb

    if not isinstance(error, duckdb.PermissionException):
        return None
    message = str(error)
    named = re.search(r'Cannot access (?:file|directory) "([^"]*)"', message)
    if named:
        return QueryRefused(f"it reads {named.group(1)}, outside the store", _RAW_HINT)
    if "extension" in message.lower():
        return QueryRefused("it loads an extension", _RAW_HINT)
    return QueryRefused(f"DuckDB refused it ({message.splitlines()[0]})", _RAW_HINT)


# --- Spark ------------------------------------------------------------------------------

_SPARK: Final = "org.apache.spark.sql."
#: Plan nodes of a read-only query (the unresolved plan, as the parser gives it).
SPARK_PLAN_NODES: Final = frozenset({
    "Project", "Filter", "Join", "LateralJoin", "SubqueryAlias", "UnresolvedWith", "OneRowRelation", "Aggregate",
    "Sort", "GlobalLimit", "LocalLimit", "Offset", "LimitAll", "Tail", "Distinct", "Deduplicate", "Union",
    "Intersect", "Except", "WithWindowDefinition", "Generate", "Pivot", "Unpivot", "LocalRelation", "Sample",
    "RepartitionByExpression", "Repartition", "RebalancePartitions", "UnresolvedHint", "UnresolvedHaving",
    "UnresolvedQualify", "UnresolvedSubqueryColumnAliases", "UnresolvedInlineTable", "UnresolvedTVFAliases",
    "Subquery", "Expand", "Window",
    # Checked further: what they read.
    "UnresolvedRelation", "UnresolvedTableOrView", "UnresolvedTableValuedFunction",
    # Statements that show, never change (their plans are walked too).
    "ExplainCommand", "DescribeQueryCommand", "DescribeRelation", "DescribeColumn", "ShowColumns", "ShowTables",
    "ShowViews", "ShowFunctions", "CurrentNamespace$", "UnresolvedNamespace",
})
#: Expressions of the analyzer package an unresolved query holds.
SPARK_EXPRESSIONS: Final = frozenset({
    "UnresolvedAttribute", "UnresolvedAlias", "UnresolvedStar", "UnresolvedStarExcept", "UnresolvedFunction",
    "UnresolvedExtractValue", "UnresolvedOrdinal", "UnresolvedRegex", "UnresolvedGenerator",
    "UnresolvedNamedLambdaVariable", "UnresolvedOuterReference", "MultiAlias", "UnresolvedSeed",
})
#: Functions that reach outside SQL: Java's static methods (System.getenv, System.exit).
SPARK_FUNCTIONS_REFUSED: Final = frozenset({"reflect", "java_method", "try_reflect"})
#: Table-valued functions of Spark 4 (none reads a file).
SPARK_TABLE_FUNCTIONS: Final = frozenset({
    "range", "explode", "explode_outer", "inline", "inline_outer", "json_tuple", "posexplode", "posexplode_outer",
    "stack", "variant_explode", "variant_explode_outer", "sql_keywords", "collations",
})
#: Statements named otherwise than by their first keyword.
SPARK_STATEMENTS: Final = {"ScriptTransformation": "TRANSFORM … USING", "InsertIntoDir": "INSERT OVERWRITE DIRECTORY",
                           "UnresolvedExecuteImmediate": "EXECUTE IMMEDIATE", "PlanWithUnresolvedIdentifier": "IDENTIFIER(…)"}
#: Plan nodes refused with a reason a user can read (others: "<keyword> is not a query").
SPARK_REFUSED: Final = {
    "InsertIntoDir": ("writes files", _SAVE_HINT), "InsertIntoStatement": ("writes tables", _SAVE_HINT),
    "InsertIntoDataSourceDirCommand": ("writes files", _SAVE_HINT),
    "CreateTableAsSelect": ("writes a table", _SAVE_HINT), "CreateTable": ("defines a table", _RAW_HINT),
    "ReplaceTableAsSelect": ("writes a table", _SAVE_HINT), "CreateViewCommand": ("defines a view", ""),
    "CreateView": ("defines a view", ""), "CreateFunction": ("loads code", ""),
    "SetCommand": ("changes the session's settings", _SETTINGS_HINT),
    "ResetCommand": ("changes the session's settings", _SETTINGS_HINT),
    "CreateVariable": ("changes the session", ""), "SetVariable": ("changes the session", ""),
    "AddJarsCommand": ("loads code", ""), "AddFilesCommand": ("adds files", ""),
    "AddArchivesCommand": ("adds files", ""), "ScriptTransformation": ("runs a program", ""),
    "CacheTable": ("caches a table", ""), "CacheTableAsSelect": ("caches a table", ""),
    "LoadData": ("reads a file into a table", _RAW_HINT),
    "UnresolvedExecuteImmediate": ("runs text that cannot be checked first", ""),
    "PlanWithUnresolvedIdentifier": ("names a table computed when it runs", ""),
}


@dataclass(frozen=True)
class SparkScope:
    """What a Spark query may read: the store (a local directory or a URL) and the views
    dfit registers over it."""

    location: str
    tables: frozenset[str]


def check_spark(parser: Any, text: str, scope: SparkScope) -> None:
    """``text`` parsed by Spark's own parser (``sessionState().sqlParser()``): one
    read-only query reading the store's views, or files under the store, else refused."""
    check_not_empty(text, backslash_escapes=True)
    statements = [part for part in _code(text, True).split(";") if part.strip()]
    if len(statements) > 1:
        raise QueryRefused(f"{len(statements)} statements in one text (one statement per query)")
    plan = json.loads(parser.parsePlan(text).toJSON())
    nodes = list(_spark_nodes(plan))
    ctes = {str(entry.get("_1")).lower() for node in nodes if _simple(node) == "UnresolvedWith"
            for entry in node.get("cteRelations") or [] if isinstance(entry, dict)}
    keyword = first_keyword(text, backslash_escapes=True)
    for node in nodes:
        _check_spark_node(node, keyword, scope, ctes)


def _spark_nodes(value: Any) -> Any:
    """Every node (plan or expression) of a plan's JSON, nested plans included."""
    if isinstance(value, dict):
        if "class" in value:
            yield value
        for item in value.values():
            yield from _spark_nodes(item)
    elif isinstance(value, list):
        for item in value:
            yield from _spark_nodes(item)


def _simple(node: dict[str, Any]) -> str:
    return str(node["class"]).rsplit(".", 1)[-1]


def _parts(field: Any) -> list[str]:
    """A name's parts as the plan's JSON writes them (``[csv, /path]``)."""
    if isinstance(field, list):
        return [str(part) for part in field]
    inner = str(field or "").strip()
    inner = inner[1:-1] if inner.startswith("[") and inner.endswith("]") else inner
    return inner.split(", ") if inner else []


def _check_spark_node(node: dict[str, Any], keyword: str, scope: SparkScope, ctes: set[str]) -> None:
    full, name = str(node["class"]), _simple(node)
    if full.startswith(_SPARK + "catalyst.expressions."):
        return
    if name in SPARK_EXPRESSIONS or name in SPARK_PLAN_NODES:
        if name == "UnresolvedFunction":
            called = (_parts(node.get("nameParts")) or [""])[-1].lower()
            if called in SPARK_FUNCTIONS_REFUSED:
                raise QueryRefused(f"{called}() calls Java methods")
        elif name in ("UnresolvedTableValuedFunction", "UnresolvedGenerator"):
            called = (_parts(node.get("name")) or [""])[-1].lower()
            if name == "UnresolvedTableValuedFunction" and called not in SPARK_TABLE_FUNCTIONS:
                raise QueryRefused(f"table function {called}() is not one of Spark's built-in generators",
                                   _RAW_HINT)
        elif name in ("UnresolvedRelation", "UnresolvedTableOrView"):
            _check_spark_relation(_parts(node.get("multipartIdentifier")), scope, ctes)
        return
    said = SPARK_STATEMENTS.get(name, keyword or name)
    if name in SPARK_REFUSED:
        why, hint = SPARK_REFUSED[name]
    else:
        why, hint = next((why for prefix, why in _SPARK_KINDS if name.startswith(prefix)), "is not a query"), ""
        said = f"{keyword} (Spark plan {name})" if keyword else name
    raise QueryRefused(f"{said} {why}", hint)


#: Families of plan nodes by their class names' prefix.
_SPARK_KINDS: Final = (("Drop", "drops objects"), ("Alter", "alters objects"), ("Rename", "alters objects"),
                       ("Create", "defines objects"), ("Replace", "defines objects"), ("Refresh", "changes the catalog"),
                       ("Repair", "changes the catalog"), ("Analyze", "changes the catalog"),
                       ("Truncate", "writes tables"), ("Delete", "writes tables"), ("Update", "writes tables"),
                       ("Merge", "writes tables"), ("Insert", "writes tables"), ("Uncache", "changes the cache"),
                       ("ClearCache", "changes the cache"), ("SetCatalog", "changes the session"),
                       ("Set", "changes the session"))


_GLOB: Final = re.compile(r"[{}\[\]*?\\,]")


def _check_spark_relation(parts: list[str], scope: SparkScope, ctes: set[str]) -> None:
    """A relation is a view of the store, a CTE, or ``FORMAT.`PATH``` under the store."""
    if len(parts) == 1:
        table = parts[0].lower()
        if table in scope.tables or table in ctes:
            return
        raise QueryRefused(f"it reads table {parts[0]!r}, not one of the store's ({', '.join(sorted(scope.tables))})")
    path = parts[-1]
    if len(parts) != 2 or not re.search(r"[/:]", path):
        raise QueryRefused(f"it reads table {'.'.join(parts)} of a catalog, not one of the store's")
    if not under_store(path, scope.location):
        raise QueryRefused(f"it reads {path}, outside the store", _RAW_HINT)


def under_store(path: str, location: str) -> bool:
    """``path`` names files under the store: no glob or escape characters, no ``..``,
    within the store once made absolute and its symlinks resolved."""
    if _GLOB.search(path) or ".." in path.replace("\\", "/").split("/"):
        return False
    if "://" in location:
        return path.startswith(location.rstrip("/") + "/")
    if path.startswith("file:"):
        path = re.sub(r"^file:(//)?", "", path)
    if "://" in path or ":" in path.split("/", 1)[0]:
        return False
    resolved, root = os.path.realpath(path), os.path.realpath(location).rstrip("/")
    return resolved == root or resolved.startswith(root + "/")


def spark_syntax_error(message: str) -> str:
    """Spark's parse error as one line naming the token and where (its message starts
    with a blank line and ends with the text and a caret)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    first = lines[0] if lines else "syntax error"
    return first.split(" == SQL ==")[0]
