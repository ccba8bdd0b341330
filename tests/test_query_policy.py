"""The read-only policy of ``dfit query`` (``dfit_mlir/fleet/store/policy.py``), through the real
CLI on stores collected from real bundles (the convnet compiled and run by IREE, full and
lite, and its compile manifest; the report store of ``tests/store_fixtures.py``):

* every hostile statement of the table below — writes, ATTACH, EXPORT, INSTALL/LOAD,
  SET/PRAGMA, COPY, file-reading functions, data-source paths, Java calls, programs —
  is refused with exit 2 and one line naming it, on DuckDB and on Spark; nothing under the
  store, the user's folder or the temporary directory is created or changed, and no byte
  of a file outside the store (a planted secret) reaches the output;
* every named report and a set of analyst queries answer what they answer without the
  policy (the same engine code on an unrestricted connection);
* resources are dfit's options: SQL cannot raise them, a huge cross join under
  ``--memory-limit`` ends in bounded time with exit 3;
* SIGINT during a long query exits 130 with no output and the store unchanged.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.store_fixtures import *  # noqa: F403  (the store fixtures)
from tests.test_bad_input import invoke, tree


@dataclass(frozen=True)
class Scene:
    """A store with watched folders around it (a user folder, the temporary directory,
    another store beside it) and a secret file outside the store."""

    root: Path
    store: Path
    user: Path
    scratch: Path
    other: Path
    secret: Path
    token: str

    def fill(self, text: str) -> str:
        return text.format(STORE=self.store, USER=self.user, SECRET=self.secret, OTHER=self.other,
                           TMP=self.scratch)

    def watched(self) -> dict[str, dict[str, str]]:
        return {str(folder): tree(folder) for folder in (self.root, self.scratch)}


@pytest.fixture(scope="module")
def small_store(tmp_path_factory: pytest.TempPathFactory, iree_bundles: dict[str, Path]) -> Path:
    from dfit_mlir.fleet.store import Placement, collect

    store = tmp_path_factory.mktemp("policy-store") / "store"
    collect([iree_bundles["full"], iree_bundles["lite"], iree_bundles["manifest"]], store, Placement(label="base"))
    return store


@pytest.fixture
def scene(tmp_path: Path, small_store: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Scene:
    import shutil
    import tempfile

    if getattr(request.node, "callspec", None) and request.node.callspec.params.get("engine") == S:
        from dfit_mlir.fleet.store import engines

        engines.spark_session()  # started (its own scratch folder made) before the watch begins

    root = tmp_path / "root"
    root.mkdir()
    store = root / "store"
    shutil.copytree(small_store, store)
    user = root / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("my notes\n")
    token = f"DFIT-SECRET-{uuid.uuid4().hex}"
    secret = user / "secret.txt"
    secret.write_text(f"{token}\n{token},{token}\n")
    (store / "link.txt").symlink_to(secret)  # planted in the store, pointing out of it
    other = root / "other-store"
    shutil.copytree(small_store, other)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    # Whatever dfit would put in the temporary directory lands in the watched one.
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    return Scene(root, store, user, scratch, other, secret, token)


D, S = "duckdb", "spark"
#: (engine, statement, what the refusal line says). {STORE}, {USER}, {SECRET}, {OTHER}:
#: the scene's paths. From the issue's campaign, DuckDB's statement list
#: (https://duckdb.org/docs/sql/statements/overview) and Spark's SQL reference
#: (https://spark.apache.org/docs/latest/sql-ref-syntax.html).
HOSTILE: list[tuple[str, str, str]] = [
    # DuckDB: writes
    (D, "COPY (SELECT * FROM events) TO '{USER}/notes.txt' (FORMAT csv)", "COPY writes files"),
    (D, "COPY (SELECT * FROM events) TO '{STORE}/bundles' (FORMAT parquet, PARTITION_BY (kind), OVERWRITE)",
     "COPY writes files"),
    (D, "COPY events TO '{USER}/events.parquet'", "COPY writes files"),
    (D, "COPY events FROM '{SECRET}'", "COPY writes files"),
    (D, "EXPORT DATABASE '{USER}/dump'", "EXPORT writes files"),
    (D, "IMPORT DATABASE '{USER}/dump'", "IMPORT runs a pragma"),
    (D, "CREATE TABLE t AS SELECT * FROM events", "CREATE defines objects"),
    (D, "CREATE OR REPLACE VIEW events AS SELECT 1 AS x", "CREATE defines objects"),
    (D, "CREATE SECRET (TYPE s3, KEY_ID 'k', SECRET 's')", "CREATE defines objects"),
    (D, "INSERT INTO events SELECT * FROM events", "INSERT writes tables"),
    (D, "UPDATE events SET kind = 'x'", "UPDATE writes tables"),
    (D, "DELETE FROM events", "DELETE writes tables"),
    (D, "DROP VIEW events", "DROP drops objects"),
    (D, "ALTER VIEW events RENAME TO gone", "ALTER alters objects"),
    (D, "BEGIN TRANSACTION", "BEGIN is a transaction statement"),
    (D, "VACUUM ANALYZE events", "VACUUM rewrites storage"),
    (D, "FORCE CHECKPOINT", "FORCE runs a procedure"),
    (D, "PREPARE p AS SELECT * FROM events", "PREPARE prepares statements"),
    # DuckDB: other databases, extensions
    (D, "ATTACH '{USER}/evil.db' AS e", "ATTACH opens another database"),
    (D, "ATTACH ':memory:' AS m", "ATTACH opens another database"),
    (D, "INSTALL httpfs", "INSTALL installs or loads an extension"),
    (D, "LOAD httpfs", "LOAD installs or loads an extension"),
    (D, "FORCE INSTALL httpfs", "FORCE installs or loads an extension"),
    (D, "UPDATE EXTENSIONS", "UPDATE is not a query"),
    # DuckDB: settings
    (D, "SET threads = 100000", "SET changes the session's settings"),
    (D, "SET memory_limit = '1TB'", "SET changes the session's settings"),
    (D, "SET enable_external_access = true", "SET changes the session's settings"),
    (D, "RESET lock_configuration", "RESET changes the session's settings"),
    (D, "PRAGMA threads = 100000", "PRAGMA changes the session's settings"),
    (D, "SET VARIABLE x = 1", "SET changes the session's settings"),
    (D, "USE memory", "USE changes the session's settings"),
    (D, "CALL pragma_version()", "CALL runs a procedure"),
    # DuckDB: files outside the store, read by functions, replacement scans, URLs
    (D, "SELECT * FROM read_csv('{SECRET}')", "outside the store"),
    (D, "SELECT * FROM read_csv_auto('{SECRET}', header = false)", "outside the store"),
    (D, "SELECT * FROM read_text('{SECRET}')", "outside the store"),
    (D, "SELECT * FROM read_text('/etc/hostname')", "outside the store"),
    (D, "SELECT * FROM read_blob('/proc/self/environ')", "outside the store"),
    (D, "SELECT * FROM read_json('{SECRET}')", "outside the store"),
    (D, "SELECT * FROM sniff_csv('{SECRET}')", "outside the store"),
    (D, "SELECT * FROM glob('/*')", "outside the store"),
    (D, "SELECT * FROM '{SECRET}'", "does not exist"),  # no replacement scan of files
    (D, "SELECT * FROM read_parquet('{STORE}/../other-store/bundles/*/*/*/events.parquet')", "outside the store"),
    (D, "SELECT * FROM parquet_metadata('{OTHER}/bundles/*/*/*/events.parquet')", "outside the store"),
    (D, "SELECT * FROM read_parquet('s3://bucket/x.parquet')", "reads s3://bucket/x.parquet, outside the store"),
    (D, "SELECT * FROM read_csv('https://example.com/x.csv')", "outside the store"),
    (D, "SELECT * FROM query('SELECT * FROM read_text(''{SECRET}'')')", "outside the store"),
    (D, "DESCRIBE SELECT * FROM read_csv('{SECRET}')", "outside the store"),
    (D, "SUMMARIZE SELECT * FROM read_text('{SECRET}')", "outside the store"),
    (D, "SELECT (SELECT content FROM read_text('{SECRET}')) AS c, * FROM events", "outside the store"),
    (D, "SELECT * FROM read_text('{STORE}/link.txt')", "outside the store"),
    # DuckDB: hidden inside another statement, several statements, none
    (D, "EXPLAIN ANALYZE COPY (SELECT 1) TO '{USER}/x.csv'", "EXPLAIN of COPY writes files"),
    (D, "SELECT 1; COPY (SELECT 1) TO '{USER}/x.csv'", "2 statements in one text"),
    (D, "/* note */ COPY (SELECT 1) TO '{USER}/x.csv'", "COPY writes files"),
    (D, "-- nothing but a comment", "empty query"),
    (D, ";;;", "empty query"),
    # Spark: writes
    (S, "INSERT OVERWRITE DIRECTORY '{STORE}/bundles' USING csv SELECT 1", "INSERT OVERWRITE DIRECTORY writes files"),
    (S, "INSERT OVERWRITE LOCAL DIRECTORY '{USER}/out' SELECT * FROM events", "writes files"),
    (S, "CREATE TABLE t USING parquet LOCATION '{USER}/t' AS SELECT * FROM events", "CREATE writes a table"),
    (S, "CREATE TABLE t (a INT) USING csv LOCATION '{USER}/t2'", "CREATE defines a table"),
    (S, "CREATE TEMPORARY VIEW v AS SELECT 1", "CREATE defines a view"),
    (S, "INSERT INTO events SELECT * FROM events", "INSERT writes tables"),
    (S, "DROP VIEW events", "DROP (Spark plan DropView) drops objects"),
    (S, "ALTER VIEW events AS SELECT 1", "alters objects"),
    (S, "LOAD DATA LOCAL INPATH '{SECRET}' INTO TABLE events", "LOAD reads a file into a table"),
    (S, "CACHE TABLE events", "CACHE caches a table"),
    (S, "CLEAR CACHE", "changes the cache"),
    (S, "CACHE TABLE c AS SELECT * FROM events", "CACHE caches a table"),
    (S, "REFRESH TABLE events", "changes the catalog"),
    (S, "MSCK REPAIR TABLE events", "changes the catalog"),
    (S, "ANALYZE TABLE events COMPUTE STATISTICS", "changes the catalog"),
    # Spark: settings, code
    (S, "SET spark.sql.shuffle.partitions = 100000", "SET changes the session's settings"),
    (S, "RESET spark.sql.shuffle.partitions", "RESET changes the session's settings"),
    (S, "ADD JAR '{USER}/x.jar'", "ADD loads code"),
    (S, "ADD FILE '{SECRET}'", "ADD adds files"),
    (S, "CREATE FUNCTION f AS 'com.example.F'", "CREATE loads code"),
    (S, "DECLARE v = 1", "DECLARE changes the session"),
    (S, "USE other", "changes the session"),
    (S, "SELECT reflect('java.lang.System', 'getenv', 'HOME')", "reflect() calls Java methods"),
    (S, "SELECT java_method('java.lang.System', 'exit', 0)", "java_method() calls Java methods"),
    (S, "SELECT TRANSFORM(kind) USING 'cat {SECRET}' FROM events", "TRANSFORM … USING runs a program"),
    (S, "EXECUTE IMMEDIATE 'SELECT * FROM text.`{SECRET}`'", "EXECUTE IMMEDIATE runs text that cannot be checked"),
    # Spark: data-source paths and catalogs outside the store
    (S, "SELECT * FROM text.`{SECRET}`", "outside the store"),
    (S, "SELECT * FROM csv.`/etc/passwd`", "reads /etc/passwd, outside the store"),
    (S, "SELECT * FROM json.`{SECRET}`", "outside the store"),
    (S, "SELECT * FROM binaryFile.`/etc/hostname`", "outside the store"),
    (S, "SELECT * FROM parquet.`{OTHER}/bundles`", "outside the store"),
    (S, "SELECT * FROM parquet.`{STORE}/../other-store/bundles`", "outside the store"),
    (S, "SELECT * FROM parquet.`{STORE}/{{bundles,../other-store}}`", "outside the store"),
    (S, "SELECT * FROM parquet.`file://{OTHER}`", "outside the store"),
    (S, "SELECT * FROM orc.`{USER}`", "outside the store"),
    (S, "SELECT * FROM text.`{STORE}/link.txt`", "outside the store"),
    (S, "SELECT * FROM identifier('text.`{SECRET}`')", "outside the store"),
    (S, "SELECT * FROM identifier(concat('text.', '`{SECRET}`'))", "IDENTIFIER(…) names a table computed"),
    (S, "SELECT (SELECT max(value) FROM text.`{SECRET}`) AS v", "outside the store"),
    (S, "SELECT * FROM events WHERE EXISTS (SELECT 1 FROM csv.`{SECRET}`)", "outside the store"),
    (S, "EXPLAIN SELECT * FROM text.`{SECRET}`", "outside the store"),
    (S, "EXPLAIN INSERT OVERWRITE DIRECTORY '{USER}/x' SELECT 1", "writes files"),
    (S, "DESCRIBE QUERY SELECT * FROM csv.`{SECRET}`", "outside the store"),
    (S, "SELECT * FROM default.secrets", "table default.secrets of a catalog"),
    (S, "SELECT * FROM spark_catalog.default.secrets", "of a catalog"),
    (S, "SELECT * FROM read_files('{SECRET}')", "table function read_files() is not one of Spark's"),
    (S, "SELECT 1; SELECT * FROM text.`{SECRET}`", "2 statements in one text"),
    (S, "-- nothing but a comment", "empty query"),
]


def _param(engine: str, sql: str, said: str) -> Any:
    marks = [pytest.mark.spark] if engine == S else []
    return pytest.param(engine, sql, said, id=f"{engine}-{sql[:60]}", marks=marks)


def test_the_table_is_large_and_covers_both_engines() -> None:
    engines = [engine for engine, _, _ in HOSTILE]
    assert len(HOSTILE) >= 40 and engines.count(D) >= 40 and engines.count(S) >= 40


@pytest.mark.parametrize(("engine", "sql", "said"), [_param(*case) for case in HOSTILE])
def test_a_hostile_statement_is_refused_and_touches_nothing(engine: str, sql: str, said: str, scene: Scene) -> None:
    text = scene.fill(sql)
    before = scene.watched()
    status, stdout, stderr, escaped = invoke(["query", "--engine", engine, "--rows", "5", "--", str(scene.store), text],
                                             scene.user)
    shown = f"dfit query {text!r} --engine {engine}\nexit {status}\nstdout: {stdout[-800:]}\nstderr: {stderr[-1500:]}"
    assert escaped is None and status == 2, shown
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("dfit: ") and said in lines[0], shown
    if "empty query" not in said and "does not exist" not in said:
        assert "dfit query only reads the store" in lines[0], shown
    assert scene.token not in stdout + stderr, shown
    assert scene.watched() == before, shown


# --- the same rows as without the policy ---------------------------------------------------

def unrestricted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engines as they were before the policy: a plain DuckDB connection and no check
    of the text (what the comparisons below are made against)."""
    import duckdb

    from dfit_mlir.fleet.store import policy

    def plain(location: str, limits: Any, prelude: tuple[str, ...] = ()) -> Any:
        connection = duckdb.connect()
        connection.execute("SET parquet_metadata_cache = true")
        for statement in prelude:
            connection.execute(statement)
        return connection

    monkeypatch.setattr(policy, "duckdb_connection", plain)
    monkeypatch.setattr(policy, "check_duckdb", lambda text: None)
    monkeypatch.setattr(policy, "check_spark", lambda parser, text, scope: None)


REPORTS = [("top-sites", {"limit": 50}), ("regressions", {"baseline": "base", "candidate": "slow"}),
           ("rank-skew", {}), ("coverage", {})]

#: Analyst queries: joins, window functions, CTEs, GROUP BY ALL, QUALIFY, subqueries, set
#: operations, DESCRIBE (both engines' syntax).
ANALYST = [
    "WITH per_run AS (SELECT run, kind, count(*) AS n, CAST(SUM(duration_ns) AS BIGINT) AS total FROM events "
    "GROUP BY ALL) SELECT p.run, r.label, p.kind, p.n, p.total FROM per_run p JOIN runs r ON r.run = p.run "
    "ORDER BY p.run NULLS LAST, p.kind NULLS LAST",
    "SELECT run, root_id, duration_ns, row_number() OVER (PARTITION BY run ORDER BY duration_ns DESC NULLS LAST, "
    "root_id NULLS LAST, start_ns NULLS LAST) AS k FROM events WHERE kind = 'dispatch' QUALIFY k <= 3 "
    "ORDER BY run NULLS LAST, k",
    "SELECT backend, model, kind, count(*) AS n FROM events GROUP BY ALL ORDER BY backend NULLS LAST, "
    "model NULLS LAST, kind NULLS LAST",
    "SELECT o.root_id, o.events, CAST(SUM(o.total_ns) OVER (PARTITION BY o.run) AS BIGINT) AS run_total, "
    "rank() OVER (PARTITION BY o.run ORDER BY o.total_ns DESC NULLS LAST, o.root_id NULLS LAST) AS place "
    "FROM op_totals o WHERE o.run IN (SELECT run FROM runs WHERE label = 'base') "
    "ORDER BY o.run NULLS LAST, place, o.root_id NULLS LAST",
    "SELECT label FROM runs WHERE label IS NOT NULL INTERSECT SELECT label FROM runs WHERE kind <> 'compile' "
    "ORDER BY label NULLS LAST",
    "SELECT s.site, count(*) AS n FROM sites s JOIN events e ON e.run = s.run AND e.site = s.site "
    "GROUP BY s.site ORDER BY n DESC, s.site NULLS LAST LIMIT 20",
]


def normalized(table: Any) -> list[dict[str, Any]]:
    return [{k: round(v, 6) if isinstance(v, float) else v for k, v in row.items()} for row in table.to_pylist()]


def _before_and_after(store: Path, monkeypatch: pytest.MonkeyPatch, run: Any) -> tuple[Any, Any]:
    after = run()
    with monkeypatch.context() as patched:
        unrestricted(patched)
        before = run()
    return before, after


@pytest.mark.parametrize(("report", "parameters"), REPORTS)
def test_every_report_answers_as_without_the_policy_on_duckdb(store: Path, report: str, parameters: dict[str, Any],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from dfit_mlir.fleet import store as bundle_store

    before, after = _before_and_after(store, monkeypatch, lambda: bundle_store.query(
        store, report=report, parameters=parameters))
    assert after.num_rows > 0 and after.to_pylist() == before.to_pylist()


@pytest.mark.parametrize("sql", ANALYST)
def test_analyst_queries_answer_as_without_the_policy_on_duckdb(store: Path, sql: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from dfit_mlir.fleet import store as bundle_store

    before, after = _before_and_after(store, monkeypatch, lambda: bundle_store.query(store, sql))
    assert after.num_rows > 0 and normalized(after) == normalized(before)


def test_duckdb_only_query_forms_still_run(store: Path) -> None:
    """DESCRIBE, SUMMARIZE, PIVOT, EXPLAIN, FROM-first, and a store file read by path."""
    from dfit_mlir.fleet import store as bundle_store

    described = bundle_store.query(store, "DESCRIBE events").column("column_name").to_pylist()
    assert {"run", "kind", "duration_ns"} <= set(described)
    assert bundle_store.query(store, "SUMMARIZE SELECT duration_ns FROM events").num_rows == 1
    pivot = bundle_store.query(store, "PIVOT (SELECT backend, kind FROM events) ON kind USING count(*) "
                                      "ORDER BY backend").to_pylist()
    counts = bundle_store.query(store, "SELECT backend, count(*) AS n FROM events WHERE kind = 'dispatch' "
                                       "GROUP BY ALL ORDER BY backend").to_pylist()
    assert {row["backend"]: row["dispatch"] for row in pivot if row["dispatch"]} == \
        {row["backend"]: row["n"] for row in counts}
    assert bundle_store.query(store, "EXPLAIN SELECT count(*) FROM events").num_rows >= 1
    [file] = sorted(store.glob("bundles/*/*/*/runs.parquet"))[:1]
    direct = bundle_store.query(store, f"FROM read_parquet('{file}') SELECT count(*) AS n").to_pylist()
    assert direct == [{"n": 1}]


@pytest.mark.spark
def test_reports_and_analyst_queries_on_spark_answer_as_duckdb_without_the_policy(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dfit_mlir.fleet import store as bundle_store

    with monkeypatch.context() as patched:
        unrestricted(patched)
        before = [normalized(bundle_store.query(store, report=r, parameters=p)) for r, p in REPORTS]
        before += [normalized(bundle_store.query(store, sql)) for sql in ANALYST]
    after = [normalized(bundle_store.query(store, report=r, parameters=p, engine="spark")) for r, p in REPORTS]
    after += [normalized(bundle_store.query(store, sql, engine="spark")) for sql in ANALYST]
    assert all(before) and after == before
    # A store file read by its path: allowed under the store.
    [file] = sorted(store.glob("bundles/*/*/*/runs.parquet"))[:1]
    assert bundle_store.query(store, f"SELECT count(*) AS n FROM parquet.`{file}`", engine="spark").to_pylist() == \
        [{"n": 1}]
    # A syntax error names the token and where it is (Spark's message starts with a blank line).
    from dfit_mlir.fleet.store.engines import QueryError

    with pytest.raises(QueryError, match=r"^query failed \(spark\): \[PARSE_SYNTAX_ERROR\] Syntax error at or near "
                                         r"'events'.*\(line 1, pos 17\)$"):
        bundle_store.query(store, "SELECT selct frm events where", engine="spark")


# --- resources ------------------------------------------------------------------------------

def test_a_query_runs_with_dfits_resources_and_cannot_raise_them(small_store: Path, tmp_path: Path) -> None:
    sql = "SELECT current_setting('threads') AS threads, current_setting('memory_limit') AS memory"
    status, stdout, stderr, _ = invoke(["query", str(small_store), sql, "--threads", "1", "--memory-limit", "200MB"],
                                       tmp_path)
    assert status == 0, stderr
    assert stdout.splitlines()[2].split() == ["1", "190.7", "MiB"], stdout  # 200 MB as DuckDB prints it
    for raise_it in ("SET threads = 64", "PRAGMA memory_limit = '100GB'", "RESET threads",
                     "SET GLOBAL enable_external_access = true", "SET lock_configuration = false"):
        status, _, stderr, _ = invoke(["query", str(small_store), raise_it, "--threads", "1"], tmp_path)
        assert status == 2 and "query refused" in stderr, (raise_it, stderr)
    for bad in (["--threads", "100000"], ["--memory-limit", "lots"], ["--memory-limit", "1PB"],
                ["--memory-limit", "1KB"]):
        status, _, stderr, _ = invoke(["query", str(small_store), "SELECT 1 AS x", *bad], tmp_path)
        assert status == 2 and stderr.startswith(f"dfit: {bad[0]} "), (bad, stderr)


def _dfit(argv: list[str], cwd: Path, scratch: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "TMPDIR": str(scratch)}
    return subprocess.Popen([sys.executable, "-m", "dfit_mlir", *argv], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


#: A cross join whose distinct count cannot stream: its hash table outgrows any small limit.
HUGE = "SELECT count(DISTINCT a.range * 1000000 + b.range) AS n FROM range(1000000) a, range(1000000) b"


def test_a_huge_cross_join_under_the_memory_limit_ends_in_bounded_time_with_exit_3(small_store: Path,
                                                                                   tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    started = time.monotonic()
    child = _dfit(["query", str(small_store), HUGE, "--memory-limit", "100MB", "--threads", "2"], tmp_path, scratch)
    try:
        stdout, stderr = child.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        child.kill()
        pytest.fail("the query under --memory-limit 100MB ran past 180 s")
    elapsed = time.monotonic() - started
    lines = stderr.strip().splitlines()
    assert child.returncode == 3 and len(lines) == 1, stderr
    assert lines[0].startswith("dfit: query failed (duckdb): it needs more memory than --memory-limit 100MB"), stderr
    assert elapsed < 180 and not list(scratch.iterdir()) and sorted(p.name for p in tmp_path.iterdir()) == ["scratch"]


# --- SIGINT during a long query ------------------------------------------------------------

#: Every event a hundred billion times: rows stream into both outputs until the signal.
LONG = {D: "SELECT e.* FROM events e, range(100000000000) r",
        S: "SELECT e.* FROM events e CROSS JOIN range(100000000000) r"}


@pytest.mark.parametrize("engine", [D, pytest.param(S, marks=pytest.mark.spark)])
def test_sigint_during_a_long_query_exits_130_and_leaves_nothing(engine: str, small_store: Path,
                                                                 tmp_path: Path) -> None:
    import shutil

    store, work, scratch = tmp_path / "store", tmp_path / "work", tmp_path / "scratch"
    shutil.copytree(small_store, store)
    work.mkdir()
    scratch.mkdir()
    before = tree(store)
    child = _dfit(["query", str(store), LONG[engine], "--engine", engine, "-o", "out.parquet", "--trace", "t.pftrace"],
                  work, scratch)
    # The outputs' temporaries exist once the rows are being read: the query is running.
    deadline = time.monotonic() + 240
    while child.poll() is None and time.monotonic() < deadline and not any(work.iterdir()):
        time.sleep(0.01)
    assert child.poll() is None, f"dfit ended before the signal: {child.communicate()}"
    time.sleep(1.0)
    sent = time.monotonic()
    child.send_signal(signal.SIGINT)
    stdout, stderr = child.communicate(timeout=60)
    shown = f"exit {child.returncode}\nstderr: {stderr[-2000:]}"
    assert child.returncode == 130 and "Traceback" not in stderr and "interrupted" in stderr, shown
    assert time.monotonic() - sent < 30, shown
    assert not list(work.iterdir()), shown  # no output file, no temporary
    assert tree(store) == before, shown
    if engine == D:
        assert not list(scratch.iterdir()), shown


# --- the policy's own pieces (no engine) ---------------------------------------------------

def test_sizes_and_limits_are_checked_before_an_engine_starts() -> None:
    from dfit_mlir.core.errors import InvalidInputError
    from dfit_mlir.fleet.store import policy

    assert policy.parse_size("4GB") == 4 * 1000**3 and policy.parse_size("512MiB") == 512 << 20
    assert policy.parse_size("2g") == 2 * 1000**3 and policy.parse_size(" 1.5 GiB ") == int(1.5 * (1 << 30))
    for bad in ("lots", "-1GB", "1e9", "4 PB", ""):
        with pytest.raises(InvalidInputError, match="--memory-limit"):
            policy.parse_size(bad)
    default = policy.limits()
    assert default.threads == policy.machine_cores() and default.memory_bytes == policy.machine_memory() // 2
    assert policy.limits(1, "100MB") == policy.Limits(1, 100 * 1000**2)
    for threads, memory in ((0, None), (policy.machine_cores() + 1, None), (None, "1KB"),
                            (None, policy.machine_memory() + 1)):
        with pytest.raises(InvalidInputError):
            policy.limits(threads, memory)


def test_a_path_under_the_store_is_one_that_stays_there(tmp_path: Path) -> None:
    """Spark's ``FORMAT.`PATH``` check: ``..``, globs, other schemes and symlinks out of
    the store are outside it (SYNTHETIC folders)."""
    from dfit_mlir.fleet.store import policy

    store = tmp_path / "store"
    (store / "bundles").mkdir(parents=True)
    (tmp_path / "outside.txt").write_text("x")
    (store / "bundles" / "link").symlink_to(tmp_path / "outside.txt")
    inside = [f"{store}/bundles", str(store), f"file:{store}/bundles", f"file://{store}/bundles"]
    outside = [f"{store}/../outside.txt", f"{store}/bundles/link", f"{store}/{{bundles,..}}", f"{store}/b*",
               f"{store}-other/x", "/etc/passwd", "s3://bucket/x", f"hdfs://{store}", "outside.txt"]
    assert all(policy.under_store(path, str(store)) for path in inside)
    assert not any(policy.under_store(path, str(store)) for path in outside)
    assert policy.under_store("s3a://b/store/bundles", "s3a://b/store")
    assert not policy.under_store("s3a://b/store-2/x", "s3a://b/store")


def test_comments_and_strings_do_not_hide_or_fake_statements() -> None:
    from dfit_mlir.core.errors import InvalidInputError
    from dfit_mlir.fleet.store import policy

    assert policy.first_keyword("/* a */ -- b\n  copy t to 'x'") == "COPY"
    policy.check_duckdb("SELECT ';' AS a, '--' AS b /* ; */")
    with pytest.raises(policy.QueryRefused, match="2 statements"):
        policy.check_duckdb("SELECT 1; /* x */ SELECT 2")
    for empty in ("", "  ", "-- c", "/* c */", ";", "; -- c\n ;"):
        with pytest.raises(InvalidInputError, match="empty query"):
            policy.check_duckdb(empty)


def test_spark_is_refused_a_store_its_scratch_folder_lies_in(small_store: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The warehouse and local directories must stay outside the store: a $TMPDIR inside
    it is refused (exit 2) before any query (the session itself stubbed: no JVM)."""
    import shutil

    from dfit_mlir.core.errors import InvalidInputError
    from dfit_mlir.fleet.store import engines

    store = tmp_path / "store"
    shutil.copytree(small_store, store)
    monkeypatch.setattr(engines, "spark_session", lambda master=None, limits=None: object())
    monkeypatch.setattr(engines, "_SPARK_SCRATCH", store / "tmp" / "dfit-spark-x")
    with pytest.raises(InvalidInputError, match="scratch folder .* lies in the store; set TMPDIR"):
        engines.SparkEngine(str(store))
    monkeypatch.setattr(engines, "_SPARK_SCRATCH", tmp_path / "elsewhere")
    assert engines.SparkEngine(str(store)).scope.location == str(store)
