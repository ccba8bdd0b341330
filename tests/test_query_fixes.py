"""What a new user's first session with ``dfit query`` / ``collect`` / ``merge`` hit
(issue 12 QA pass), on a store collected from real bundles (a run of the convnet, IREE
full mode; the reconstructed SambaFlow BertLarge compile + 8-task run logs): each bad
input is one line naming what is at fault, a documented exit, no traceback, nothing
written; each result is the engine's rows, unrounded, whatever their type."""

from __future__ import annotations

import json
import math
import shutil
import socket
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from dfit_mlir.fleet import store as bundle_store
from tests.conftest import vendor_fixture
from tests.test_bad_input import invoke, invoke_child, tree
from tests.test_query_outputs import StoreArt, put, store_art  # noqa: F401  (the store fixture)


def refused(argv: list[str], cwd: Path, *, status: int = 2, child: bool = False) -> str:
    """Run ``dfit ARGV`` expecting a refusal: its one stderr line; nothing under ``cwd`` changed."""
    before = tree(cwd)
    code, stdout, stderr, escaped = (invoke_child if child else invoke)(argv, cwd)
    shown = f"dfit {' '.join(argv)}\nexit {code}\nstdout: {stdout[-1500:]}\nstderr: {stderr[-2000:]}"
    assert escaped is None and code == status, shown
    assert "Traceback" not in stdout + stderr and "internal error" not in stderr, shown
    lines = [line for line in stderr.strip().splitlines() if line.startswith("dfit")]
    assert len(lines) == 1, shown
    assert tree(cwd) == before, shown
    return lines[0]


@pytest.fixture()
def work(store_art: StoreArt, tmp_path: Path) -> Path:  # noqa: F811
    put(store_art.store, tmp_path, "store")
    return tmp_path


# --- QA #6: one SQL text, the same rows on both engines: nothing rounded in SQL ------------------

def test_report_sql_rounds_nothing() -> None:
    """ROUND(double, n) differs between DuckDB and Spark (17007157.95 → 17007157.9 on
    DuckDB, not on Spark; tests/test_store_spark.py): no report may round; `dfit query`
    rounds only what it prints."""
    from dfit_mlir.fleet.store.reports import REPORTS

    for name, report in REPORTS.items():
        code = "\n".join(line.split("--", 1)[0] for line in report.text().splitlines())
        assert "ROUND(" not in code.upper().replace(" ", ""), name


def test_top_sites_values_are_the_exact_quotients(work: Path) -> None:
    got = bundle_store.query(work / "store", report="top-sites", parameters={"limit": 1000}).to_pylist()
    assert got
    totals: dict[tuple[str, str], int] = {}
    for row in got:
        totals[(row["backend"], row["model"])] = totals.get((row["backend"], row["model"]), 0) + row["total_ns"]
        assert row["mean_ns"] == row["total_ns"] / row["events"]
    for row in got:
        assert row["attributed_share"] == row["total_ns"] / totals[(row["backend"], row["model"])]


def test_printed_floats_are_rounded_for_reading() -> None:
    from dfit_mlir.fleet.store.output import render

    table = pa.table({"mean_ns": [17007157.95, 0.123456789], "ids": [["a", "b"], None]})
    text = render(table)
    assert "17007157.9" in text and "0.123457" in text and '["a", "b"]' in text and "(2 rows)" in text


# --- QA #7: list / struct columns to CSV ----------------------------------------------------------

def test_list_columns_go_to_csv_as_json_text(work: Path) -> None:
    sql = "SELECT * FROM sites ORDER BY run, site"
    for name in ("sites.csv", "sites.parquet"):
        status, stdout, stderr, _ = invoke(["query", "store", sql, "-o", name, "--rows", "2"], work)
        assert status == 0, stderr
    exact = pq.read_table(work / "sites.parquet")
    written = pacsv.read_csv(work / "sites.csv", convert_options=pacsv.ConvertOptions(
        column_types={"ids": pa.string()}))
    assert written.num_rows == exact.num_rows > 0 and pa.types.is_list(exact.schema.field("ids").type)
    assert [json.loads(text) for text in written.column("ids").to_pylist()] == exact.column("ids").to_pylist()
    assert written.column("root_id").to_pylist() == exact.column("root_id").to_pylist()
    struct = "SELECT {'site': site, 'ids': ids} AS call FROM sites ORDER BY run, site LIMIT 3"
    status, _, stderr, _ = invoke(["query", "store", struct, "-o", "calls.csv"], work)
    assert status == 0, stderr
    calls = [json.loads(text) for text in pacsv.read_csv(work / "calls.csv").column("call").to_pylist()]
    assert calls == bundle_store.query(work / "store", struct).column("call").to_pylist()


# --- QA #12, #24, #14: what is asked ---------------------------------------------------------------

@pytest.mark.parametrize(("argv", "message"), [
    (["top-site"], "no report 'top-site' (reports: coverage, rank-skew, regressions, top-sites); "
                   "did you mean 'top-sites'?"),
    (["regresions", "-o", "r.csv"], "did you mean 'regressions'?"),
    (["frobnicate"], "no report 'frobnicate' (reports:"),
    ([""], "empty query"),
    (["  \n ", "-o", "out.txt"], "empty query"),
    (["SELEC nothing", "-o", "out.txt"], "out.txt: -o writes .csv or .parquet"),
    (["regressions", "--baseline", "base", "--candidate", "base", "--threshold", "nan"], "--threshold nan is not"),
    (["regressions", "--baseline", "base", "--candidate", "base", "--threshold", "inf"], "--threshold inf is not"),
    (["regressions", "--baseline", "base", "--candidate", "base", "--threshold", "1e400", "-o", "r.csv"],
     "--threshold 1e400 is not a finite number in [0, 1e+06]"),
    (["regressions", "--baseline", "base", "--candidate", "base", "--threshold", "-1"], "--threshold -1 is not"),
    (["regressions", "--baseline", "base", "--candidate", "base", "--threshold", "0.1; DROP"], "is not a number"),
    (["top-sites", "--limit", "99999999999999"], "--limit 99999999999999 is not a finite number in"),
    (["regressions", "--baseline", "nope", "--candidate", "base"],
     "report regressions: no run has label 'nope' (--baseline); labels in the store: 'base'"),
])
def test_what_is_asked_is_checked_before_it_runs(argv: list[str], message: str, work: Path) -> None:
    line = refused(["query", "store", *argv], work)
    assert message in line, line


def test_one_word_naming_a_table_gives_its_rows(work: Path) -> None:
    status, stdout, stderr, _ = invoke(["query", "store", "runs"], work)
    assert status == 0 and "(2 rows)" in stdout and "base" in stdout, stderr


def test_report_parameters_are_checked_in_the_library_too(work: Path) -> None:
    from dfit_mlir.core.errors import InvalidInputError
    from dfit_mlir.fleet.store.dialects import DUCKDB, SPARK

    for dialect in (DUCKDB, SPARK):
        for value in (math.nan, math.inf, -0.5, 1e7):
            with pytest.raises(InvalidInputError, match="--threshold"):
                bundle_store.report_sql("regressions", dialect, {"baseline": "a", "candidate": "b", "threshold": value})
    with pytest.raises(InvalidInputError, match="--limit 2.5 is not an integer"):
        bundle_store.query(work / "store", report="top-sites", parameters={"limit": 2.5})


# --- QA #13: reports with no rows say why -------------------------------------------------------------

def test_rank_skew_without_ranks_says_why_it_is_empty(store_art: StoreArt, tmp_path: Path) -> None:  # noqa: F811
    bundle_store.collect([store_art.run], tmp_path / "single")
    status, stdout, stderr, _ = invoke(["query", "single", "rank-skew"], tmp_path)
    assert status == 0 and "(0 rows)" in stdout, stderr
    [note] = stderr.strip().splitlines()
    assert note.startswith("dfit query rank-skew: no event in the store names a rank or a task (pid)")
    # The 8 SambaFlow tasks have pids: rows, no note.
    status, stdout, stderr, _ = invoke(["query", put(store_art.store, tmp_path, "s"), "rank-skew"], tmp_path)
    assert status == 0 and "(0 rows)" not in stdout and stderr == "", stderr


def test_regressions_with_no_rows_says_why(work: Path) -> None:
    """The store's two runs are both labelled base: compared with themselves nothing
    changes; asking for more runs than there are is said, not silent."""
    common = bundle_store.query(work / "store", "SELECT COUNT(*) AS n FROM "
                                "(SELECT DISTINCT backend, model, op_id FROM op_ledger WHERE calls > 0) t").to_pylist()
    for extra, note in (([], f"none of the {common[0]['n']} stable IDs timed on both sides changed outside the "
                             "runs' spread and by more than --threshold"),
                        (["--min-runs", "3"], "'base' has 2 run(s), fewer than --min-runs 3: the runs' spread is "
                                              "unknown, so no change is reported")):
        status, stdout, stderr, _ = invoke(["query", "store", "regressions", "--baseline", "base", "--candidate",
                                            "base", *extra], work)
        assert status == 0 and "(0 rows)" in stdout, stderr
        assert stderr.strip().splitlines() == [f"dfit query regressions: {note}"]


# --- QA #17: printing reads only what it prints; files are streamed ---------------------------------

def test_printing_reads_only_the_rows_shown(work: Path) -> None:
    total = bundle_store.query(work / "store", "SELECT count(*) AS n FROM events").column(0)[0].as_py()
    status, stdout, stderr, _ = invoke(["query", "store", "SELECT * FROM events", "--rows", "3"], work)
    assert status == 0, stderr
    assert stdout.rstrip().endswith("… more rows (write them all with -o)") and f"({total} rows)" not in stdout
    assert len(stdout.strip().splitlines()) == 2 + 3 + 1
    with bundle_store.prepare(work / "store", "SELECT * FROM events ORDER BY start_ns") as prepared:
        head = prepared.head(4)
        assert head.to_pylist() == prepared.table().slice(0, 4).to_pylist()


def test_files_are_streamed_in_batches_with_every_row(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of 17 rows: the table file and the trace hold what the whole result
    gives, the count printed is every row."""
    from dfit_mlir.fleet.store import engines, output
    from tests.conftest import read_pftrace

    sql = "SELECT * FROM events WHERE start_ns IS NOT NULL"
    whole = bundle_store.query(work / "store", sql)
    output.write_trace(whole, work / "whole.pftrace")
    monkeypatch.setattr(engines, "STREAM_ROWS", 17)
    status, stdout, stderr, _ = invoke(["query", "store", sql, "-o", "rows.parquet", "--trace", "t.pftrace",
                                        "--rows", "2"], work)
    assert status == 0, stderr
    assert whole.num_rows > 17 * 3 and f"({whole.num_rows} rows)" in stdout

    def ordered(rows: list[dict[str, object]]) -> list[str]:
        return sorted(json.dumps(row, sort_keys=True, default=str) for row in rows)

    assert ordered(pq.read_table(work / "rows.parquet").to_pylist()) == ordered(whole.to_pylist())
    assert len(read_pftrace(work / "t.pftrace")[1]) == len(read_pftrace(work / "whole.pftrace")[1]) > 0


# --- QA #23: rows a trace cannot hold -----------------------------------------------------------------

DISPATCHES = "(SELECT *, row_number() OVER (ORDER BY start_ns, name) AS n FROM events WHERE kind = 'dispatch') d"


@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT start_ns, NULL AS kind, stage FROM events", "--trace: column kind is NULL in every row"),
    (f"SELECT start_ns, CASE WHEN n = 2 THEN NULL ELSE kind END AS kind, stage FROM {DISPATCHES} ORDER BY n",
     "--trace: row 2 of the result: kind is NULL"),
    ("SELECT start_ns / 2 AS start_ns, kind, stage FROM events", "--trace: column start_ns is double, not integer"),
    ("SELECT CAST(start_ns AS VARCHAR) AS start_ns, kind, stage FROM events", "column start_ns is string"),
    (f"SELECT CASE WHEN n = 5 THEN -1 ELSE start_ns END AS start_ns, kind, stage FROM {DISPATCHES} ORDER BY n",
     "--trace: row 5 of the result: start_ns is negative"),
    (f"SELECT start_ns, CASE WHEN n = 3 THEN -20 ELSE duration_ns END AS duration_ns, kind, stage "
     f"FROM {DISPATCHES} ORDER BY n", "--trace: row 3 of the result: duration_ns is negative"),
    ("SELECT start_ns, 7 AS kind, stage FROM events", "--trace: column kind is int32, not text"),
])
def test_rows_a_trace_cannot_hold_are_refused_by_column_or_row(sql: str, message: str, work: Path) -> None:
    """Neither output is left behind, not even the table file that was fine."""
    line = refused(["query", "store", sql, "--trace", "t.pftrace", "-o", "rows.csv"], work)
    assert message in line, line


def test_a_trace_says_which_rows_it_left_out(work: Path) -> None:
    """QA #22: rows without a start time cannot be drawn; the command says how many it left out,
    and each run's track group names its model."""
    from tests.conftest import read_pftrace

    timed = "(SELECT * FROM events WHERE kind = 'dispatch' LIMIT 5)"
    untimed = "(SELECT * REPLACE (CAST(NULL AS BIGINT) AS start_ns) FROM events WHERE kind = 'dispatch' LIMIT 3)"
    code, stdout, stderr, escaped = invoke(["query", "store", f"SELECT * FROM {timed} UNION ALL SELECT * FROM "
                                            f"{untimed}", "--trace", "t.pftrace", "--rows", "0"], work)
    assert code == 0 and escaped is None, stdout + stderr
    assert "wrote t.pftrace (5 events; 3 rows without start_ns left out)" in stdout
    tracks, _ = read_pftrace(work / "t.pftrace")
    model = bundle_store.query(work / "store", "SELECT model FROM events WHERE kind = 'dispatch' LIMIT 1")
    assert any(name.startswith(f"{model.column('model')[0]} · run ") for name in tracks.values())


# --- QA #18: collect given a model file -------------------------------------------------------------------

def test_collect_given_a_model_file_names_it_and_creates_no_store(iree_bundles: dict[str, Path],
                                                                 tmp_path: Path) -> None:
    models = [vendor_fixture("edgetpu/coral_test_data/mobilenet_v1_0.5_160_quant.tflite"),
              iree_bundles["manifest"].parent / "full.vmfb"]
    for model in models:
        shutil.copy(model, tmp_path / model.name)
        line = refused(["collect", model.name, "-o", "s"], tmp_path)
        assert line.startswith(f"dfit: {model.name}: not a dfit bundle or manifest ("), line
    (tmp_path / "blob.bin").write_bytes(bytes(range(256)) * 64)
    line = refused(["collect", "blob.bin", "-o", "s"], tmp_path)
    assert "blob.bin: not a dfit bundle or manifest (a binary file)" in line


# --- QA #1-#4: outputs over inputs and over other kinds of dfit output ---------------------------------

def test_merge_does_not_replace_a_run_bundle_without_force(store_art: StoreArt, iree_bundles: dict[str, Path],  # noqa: F811
                                                          tmp_path: Path) -> None:
    for name in ("a", "c"):
        put(store_art.run, tmp_path, name)
    put(iree_bundles["ids"], tmp_path, "b")  # another run of the vmfb: merge refuses a bundle and its copy
    line = refused(["merge", "a", "b", "-o", "c"], tmp_path)
    assert line == ("dfit: c: refusing to overwrite: it is a dfit run (full) bundle, not a merged bundle "
                    "(use --force to replace it)")
    status, stdout, stderr, _ = invoke(["merge", "a", "b", "-o", "c", "--force"], tmp_path)
    assert status == 0 and json.loads((tmp_path / "c" / "summary.json").read_text())["mode"] == "merged", stderr
    status, stdout, stderr, _ = invoke(["merge", "a", "b", "-o", "c"], tmp_path)  # its own output now
    assert status == 0, stderr
    put(store_art.reconstruction, tmp_path, "r")
    line = refused(["merge", "a", "b", "-o", "r"], tmp_path)
    assert "it is a dfit reconstructed bundle, not a merged bundle" in line


@pytest.mark.parametrize(("argv", "message"), [
    (["collect", "run", "-o", "run/store"], "run/store: refusing to write an output inside the input run"),
    (["merge", "run", "run2", "-o", "run2/merged"], "run2/merged: refusing to write an output inside the input run2"),
    (["query", "store", "SELECT 1 AS x", "-o", "store/bundles/x.csv"], "inside the input store"),
    (["query", "store", "SELECT 1 AS x", "-o", "mine.csv"], "mine.csv: refusing to overwrite: it exists and dfit "
                                                            "did not write it"),
    (["query", "store", "SELECT * FROM events", "--trace", "mine.pftrace"], "mine.pftrace: refusing to overwrite"),
])
def test_outputs_over_inputs_or_user_files_are_refused(argv: list[str], message: str, work: Path,
                                                       store_art: StoreArt) -> None:  # noqa: F811
    put(store_art.run, work, "run")
    put(store_art.run, work, "run2")
    (work / "mine.csv").write_text("mine\n")
    (work / "mine.pftrace").write_bytes(b"mine")
    line = refused(argv, work)
    assert message in line, line


# --- QA #11: engines and storage that fail -------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_bad_spark_masters_fail_fast_with_one_line(work: Path) -> None:
    """A malformed master is bad usage (2); a standalone master nobody answers at is the
    engine failing (3), found in well under Spark's minute of registration retries,
    before any JVM starts."""
    import time

    line = refused(["query", "store", "top-sites", "--engine", "spark", "--master", "bogus"], work, child=True)
    assert "--master 'bogus' is not a Spark master URL" in line
    start = time.monotonic()
    port = _free_port()
    line = refused(["query", "store", "top-sites", "--engine", "spark", "--master", f"spark://127.0.0.1:{port}"],
                   work, status=3, child=True)
    assert line == f"dfit: --master spark://127.0.0.1:{port}: no Spark master answers there (Connection refused)"
    assert time.monotonic() - start < 30


def test_store_urls_duckdb_cannot_read_without_downloading(work: Path) -> None:
    import duckdb

    installed = duckdb.sql("SELECT installed FROM duckdb_extensions() WHERE extension_name = 'httpfs'").fetchall()
    if installed and installed[0][0]:
        pytest.skip("httpfs is installed here: DuckDB would read s3a:// (over the network)")
    line = refused(["query", "s3a://bucket/store", "top-sites"], work, status=3)
    assert line.startswith("dfit: s3a://bucket/store: DuckDB needs its httpfs extension") and "download" in line
    line = refused(["query", "foo://bucket/store", "top-sites"], work)
    assert "foo://bucket/store: --engine duckdb reads no foo:// store" in line
    line = refused(["query", "s3a://", "top-sites"], work)
    assert "not a store URL" in line
