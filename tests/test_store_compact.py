"""Store layout 1.1 on real bundles of the suite: the ``op_totals`` rollup written at
collect time equals the aggregate of the raw events (computed here in Python, and by the
engines from ``events``); every report reads the same rows with and without it, from a
store written by layout 1.0, and before and after ``dfit store compact``; compaction is
crash-safe (killed before or after its commit) and collect stays idempotent after it."""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from dfit_mlir.cli.app import main
from dfit_mlir.fleet import store as bundle_store
from dfit_mlir.fleet.store import compact as compaction
from dfit_mlir.fleet.store import engines, layout, reports
from tests.store_fixtures import *  # noqa: F403  (the store fixtures)

pytestmark = pytest.mark.slow

REPORTS = [("top-sites", {"limit": 1000}), ("regressions", {"baseline": "base", "candidate": "slow"}),
           ("regressions", {"baseline": "slow", "candidate": "base"}), ("rank-skew", {}), ("coverage", {})]
#: Raw tables, compared row for row (collected_at differs between copies of no store: kept).
TABLE_QUERIES = [
    "SELECT run, kind, count(*) AS n, CAST(SUM(duration_ns) AS BIGINT) AS total, count(step) AS steps, "
    "count(rank) AS ranked FROM events GROUP BY run, kind ORDER BY run, kind",
    "SELECT * FROM runs ORDER BY run",
    "SELECT backend, model, run, id, op, source_file, source_line, module_path FROM operators "
    "ORDER BY run, id NULLS LAST",
    "SELECT backend, model, run, site, function, root_id FROM sites ORDER BY run, site",
    "SELECT backend, model, run, aspect, status FROM coverage ORDER BY run, aspect, status",
    "SELECT backend, model, run, name, kind, operators FROM partitions ORDER BY run, name NULLS LAST, kind",
    "SELECT backend, model, run, partition, op_id, role, calls, time_ns, flops, transcendentals, run_instances "
    "FROM op_ledger ORDER BY run, partition NULLS LAST, op_id",
]


def normalized(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: round(v, 6) if isinstance(v, float) else v for k, v in row.items()} for row in rows]


def answers(path: Path | str, engine: str = "duckdb", **options: Any) -> dict[str, Any]:
    """Every report's rows and the raw tables' contents, on one engine."""
    got: dict[str, Any] = {}
    for name, parameters in REPORTS:
        table = bundle_store.query(path, report=name, parameters=parameters, engine=engine, **options)
        got[f"{name} {parameters}"] = normalized(table.to_pylist())
    for sql in TABLE_QUERIES:
        got[sql] = normalized(bundle_store.query(path, sql, engine=engine, **options).to_pylist())
    return got


def python_op_totals(events_file: Path) -> dict[str, dict[str, Any]]:
    """op_totals of one bundle's events, computed here (independent of the SQL)."""
    per: dict[str, dict[str, Any]] = defaultdict(lambda: {"events": 0, "total_ns": 0, "durations": []})
    instances = set()
    for event in pq.read_table(events_file).to_pylist():
        if event["root_id"] is None or event["duration_ns"] is None:
            continue
        row = per[event["root_id"]]
        row["events"] += 1
        row["total_ns"] += event["duration_ns"]
        row["durations"].append(event["duration_ns"])
        instances.add(event["invocation"] if event["invocation"] is not None else (event["step"] or 0))
    return {root: {"events": r["events"], "total_ns": r["total_ns"], "min_ns": min(r["durations"]),
                   "max_ns": max(r["durations"]), "sumsq_ns": float(sum(d * d for d in r["durations"])),
                   "run_instances": len(instances)} for root, r in per.items()}


@pytest.fixture(scope="module")
def reference(store: Path) -> dict[str, Any]:
    return answers(store)


# --- the rollup -----------------------------------------------------------------------------

def test_op_totals_equal_the_raw_events_of_every_bundle(store: Path) -> None:
    stored = defaultdict(dict)
    for row in bundle_store.query(store, "SELECT * FROM op_totals").to_pylist():
        stored[row["run"]][row["root_id"]] = row
    timed_bundles = 0
    for bundle in layout.bundle_dirs(store):
        run = bundle.name.split("=", 1)[1]
        expected = python_op_totals(bundle / "events.parquet")
        assert pq.read_table(bundle / "op_totals.parquet").num_rows == len(expected)
        got = stored.get(run, {})
        assert set(got) == set(expected), run
        for root, values in expected.items():
            row = got[root]
            assert {k: row[k] for k in ("events", "total_ns", "min_ns", "max_ns", "run_instances")} == \
                {k: values[k] for k in ("events", "total_ns", "min_ns", "max_ns", "run_instances")}
            assert row["sumsq_ns"] == pytest.approx(values["sumsq_ns"], rel=1e-12)
        timed_bundles += bool(expected)
    # Per-dispatch times: the convnet's full run, its two reruns and four label copies,
    # squeezenet's full run (lite/ids runs and the reconstructions time no root op).
    assert timed_bundles == 8
    # And the engines compute the same rows from the events (what a 1.0 store reads).
    computed = bundle_store.query(store, "SELECT * FROM op_totals ORDER BY run, root_id", use_rollups=False)
    files = bundle_store.query(store, "SELECT * FROM op_totals ORDER BY run, root_id")
    assert normalized(computed.to_pylist()) == normalized(files.to_pylist())


def test_reports_read_the_same_rows_without_the_rollup(store: Path, reference: dict[str, Any]) -> None:
    assert answers(store, use_rollups=False) == reference
    text = reports.get("top-sites").render(engines.dialects.DUCKDB, {})
    assert "op_ledger" in text and engines.tables_named(text) == ["op_ledger"]


def test_a_store_given_as_a_url_reads_the_same(tmp_path: Path, store: Path, compacted_store: Path,
                                                reference: dict[str, Any]) -> None:
    """``file://`` takes the path object stores take (no listing of directories here: the
    engine globs, reads the compaction index itself, asks which runs lack a rollup)."""
    assert answers(f"file://{compacted_store}") == reference  # every bundle's files in parts: no glob matches
    # Compacted parts (events of the small bundles only), bundles collected after the
    # compaction, and some of those written by layout 1.0 (no op_totals file).
    mixed, aside = tmp_path / "mixed", tmp_path / "aside"
    shutil.copytree(store, mixed)
    later = layout.bundle_dirs(mixed)[::3]
    for bundle in later:
        shutil.move(bundle, aside / bundle.relative_to(mixed))
    compaction.compact(mixed, small_events=10)
    for bundle in later:
        shutil.move(aside / bundle.relative_to(mixed), bundle)
    for bundle in later[::2]:
        (bundle / "op_totals.parquet").unlink()
    assert len(layout.read_index(mixed)["runs"]) == 17 - len(later) and len(later) >= 4
    assert answers(f"file://{mixed}") == answers(mixed) == reference


def test_a_store_written_by_layout_1_0_still_reads(tmp_path: Path, store: Path, reference: dict[str, Any]) -> None:
    """No op_totals files (layout 1.0), or some bundles with and some without (a 1.0 store
    that a newer dfit collected into): the same rows; compaction computes the rollup."""
    old = tmp_path / "old"
    shutil.copytree(store, old)
    meta = json.loads((old / layout.META_FILE).read_text())
    (old / layout.META_FILE).write_text(json.dumps({**meta, "version": "1.0"}))
    bundles = layout.bundle_dirs(old)
    for bundle in bundles[::2]:
        (bundle / "op_totals.parquet").unlink()
    assert answers(old) == reference
    for bundle in bundles[1::2]:
        (bundle / "op_totals.parquet").unlink()
    assert answers(old) == reference
    compaction.compact(old)
    assert answers(old) == reference


def test_a_compacted_store_of_layout_1_1_is_refused_until_collected_again(tmp_path: Path, compacted_store: Path,
                                                                         reference: dict[str, Any]) -> None:
    """A store compacted by layout 1.1 has no op_ledger rows in parts or bundles: the
    reports that read them refuse it with one line naming a bundle (the rows need the
    bundle's manifest and events), and collecting its bundles again (runs.source) adds
    each one's table in place, after which every report reads as before."""
    old = tmp_path / "old"
    shutil.copytree(compacted_store, old)
    index_path = old / layout.COMPACTED / layout.INDEX_FILE
    index = json.loads(index_path.read_text())
    for name in index["parts"].pop("op_ledger"):
        Path(layout.part_path(str(old), "op_ledger", name)).unlink()
    for entry in index["runs"].values():
        entry["tables"].remove("op_ledger")
    index_path.write_text(json.dumps(index))
    result = CliRunner().invoke(main, ["query", str(old), "top-sites"])
    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert "collected by an older store layout, without the ledger table op_ledger" in line and str(old) in line
    assert bundle_store.query(old, "SELECT count(*) AS n FROM runs").to_pylist() == [{"n": 17}]  # the rest reads
    sources = [row["source"] for row in bundle_store.query(old, "SELECT source FROM runs").to_pylist()]
    done = bundle_store.collect([Path(source) for source in sources], old)
    assert not any(entry.added for entry in done)
    assert answers(old) == reference


def test_compacting_a_bundle_without_its_ledger_table_keeps_it_refused(tmp_path: Path, store: Path,
                                                                       reference: dict[str, Any]) -> None:
    """A 1.1 bundle compacted by 1.2: its ledger rows are not claimed to be in parts, so
    the store is still refused until the bundle is collected again, into its folder."""
    old = tmp_path / "old"
    shutil.copytree(store, old)
    bundle = layout.bundle_dirs(old)[0]
    (bundle / "op_ledger.parquet").unlink()
    compaction.compact(old)
    assert "op_ledger" not in layout.read_index(old)["runs"][bundle.name.split("=", 1)[1]]["tables"]
    result = CliRunner().invoke(main, ["query", str(old), "top-sites"])
    assert result.exit_code == 2 and result.output.startswith(f"dfit: {bundle}: collected by an older store layout")
    source = bundle_store.query(old, f"SELECT source FROM runs WHERE run = '{bundle.name.split('=', 1)[1]}'")
    (done,) = bundle_store.collect([Path(source.column(0)[0].as_py())], old)
    assert not done.added and (bundle / "op_ledger.parquet").is_file()
    assert answers(old) == reference


# --- compaction ------------------------------------------------------------------------------

def test_compaction_keeps_every_row_in_few_files(store: Path, compacted_store: Path,
                                                 reference: dict[str, Any]) -> None:
    assert answers(compacted_store) == reference
    before = sum(1 for _ in store.rglob("*.parquet"))
    after = sorted(compacted_store.rglob("*.parquet"))
    index = layout.read_index(compacted_store)
    listed = {layout.part_path(str(compacted_store), t, n) for t, names in index["parts"].items() for n in names}
    assert {str(p) for p in after} == listed and len(after) < before / 3
    # Hive partitions of the parts, readable by any engine that reads Hive layouts.
    for path in after:
        assert path.parent.name.startswith("model=") and path.parent.parent.name.startswith("backend=")
    assert set(index["runs"]) == {r["run"] for r in reference["SELECT * FROM runs ORDER BY run"]}
    meta = json.loads((compacted_store / layout.META_FILE).read_text())
    assert meta["min_reader_version"] == "1.1"  # a dfit that knows no compaction must not read it
    # Each bundle directory stays, with its ownership marker only (collect knows the run).
    for bundle in layout.bundle_dirs(compacted_store):
        assert [p.name for p in bundle.iterdir()] == [".dfit-output.json"]


def test_big_bundles_keep_their_events_file(tmp_path: Path, store: Path, reference: dict[str, Any]) -> None:
    path = tmp_path / "store"
    shutil.copytree(store, path)
    done = compaction.compact(path, small_events=10)
    assert done.runs == 17
    kept = sorted(p.parent.name for p in path.glob("bundles/*/*/*/*.parquet"))
    index = layout.read_index(path)
    big = sorted(f"run={run}" for run, placed in index["runs"].items() if placed["events"] >= 10)
    assert kept == big and big
    assert all(p.name == "events.parquet" for p in path.glob("bundles/*/*/*/*.parquet"))
    assert answers(path) == reference


def test_collect_after_compaction_is_idempotent_and_adds_new_runs(
        tmp_path: Path, store: Path, store_bundles: dict[str, Any], reference: dict[str, Any]) -> None:
    path = tmp_path / "store"
    shutil.copytree(store, path)
    iree = store_bundles["iree"]
    compaction.compact(path)
    (again,) = bundle_store.collect([iree["full"]], path, bundle_store.Placement(label="other"))
    assert not again.added and again.events == pq.ParquetFile(iree["full"] / "events.parquet").metadata.num_rows
    assert answers(path) == reference
    # A new run after a compaction is read from its directory, then from the next parts.
    from tests.store_fixtures import copy_bundle

    extra = copy_bundle(iree["full"], tmp_path / "extra")
    (added,) = bundle_store.collect([extra], path, bundle_store.Placement(label="extra"))
    assert added.added
    count = f"SELECT count(*) AS n FROM events WHERE run = '{added.run}'"
    assert bundle_store.query(path, count).to_pylist() == [{"n": added.events}]
    done = compaction.compact(path)
    assert (done.runs, done.compacted_runs) == (1, 18)
    assert bundle_store.query(path, count).to_pylist() == [{"n": added.events}]
    assert bundle_store.query(path, "SELECT count(*) AS n FROM runs").to_pylist() == [{"n": 18}]


def test_a_crash_before_the_commit_leaves_the_store_as_it_was(
        tmp_path: Path, store: Path, reference: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "store"
    shutil.copytree(store, path)

    def killed(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt  # the process ends while parts are written, before the index

    monkeypatch.setattr(compaction.atomic, "write_text", killed)
    with pytest.raises(KeyboardInterrupt):
        compaction.compact(path)
    monkeypatch.undo()
    orphans = list((path / layout.COMPACTED).rglob("part-*.parquet"))
    assert orphans and not (path / layout.COMPACTED / layout.INDEX_FILE).exists()
    assert answers(path) == reference  # the parts nobody listed are not read
    compaction.compact(path)
    assert not any(p.exists() for p in orphans)  # removed by the next compaction
    assert answers(path) == reference


def test_a_crash_after_the_commit_reads_each_run_once(
        tmp_path: Path, store: Path, reference: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "store"
    shutil.copytree(store, path)

    def killed(*args: Any, **kwargs: Any) -> int:
        raise KeyboardInterrupt  # committed; the bundles' files not yet removed

    monkeypatch.setattr(compaction, "_remove_superseded", killed)
    with pytest.raises(KeyboardInterrupt):
        compaction.compact(path)
    monkeypatch.undo()
    assert len(list(path.glob("bundles/*/*/*/runs.parquet"))) == 17  # still there, not read
    assert answers(path) == reference
    done = compaction.compact(path)
    assert done.runs == 0 and done.removed_files == 17 * len(layout.TABLES)
    assert answers(path) == reference


def test_one_compaction_at_a_time_and_cli(tmp_path: Path, store: Path) -> None:
    import fcntl

    path = tmp_path / "store"
    shutil.copytree(store, path)
    (path / layout.COMPACTED).mkdir()
    with open(path / layout.COMPACTED / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(compaction.StoreBusyError, match="another `dfit store compact`"):
            compaction.compact(path)
    runner = CliRunner()
    result = runner.invoke(main, ["store", "compact", str(path)])
    assert result.exit_code == 0, result.output
    assert "compacted 17 bundles" in result.output and "17 runs compacted in all" in result.output
    result = runner.invoke(main, ["store", "compact", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "not a dfit store" in result.output and "Traceback" not in result.output
    # A store a newer layout wrote for newer readers only: refused, named, exit 2.
    meta = json.loads((path / layout.META_FILE).read_text())
    (path / layout.META_FILE).write_text(json.dumps({**meta, "version": "1.9", "min_reader_version": "1.9"}))
    result = runner.invoke(main, ["query", str(path), "top-sites"])
    assert result.exit_code == 2 and "needs a dfit that reads store layout 1.9" in result.output


def test_a_missing_store_dependency_is_a_one_line_toolchain_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """``dfit collect`` computes rollups with DuckDB: without the store extra, say so (exit 3)."""
    import sys

    from dfit_mlir.core.errors import ToolchainError

    monkeypatch.setitem(sys.modules, "duckdb", None)  # what an environment without it imports
    with pytest.raises(ToolchainError, match=r"needs duckdb: pip install 'dfit-mlir\[store\]'") as raised:
        layout.require("duckdb")
    assert raised.value.exit_code == 3
