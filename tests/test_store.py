"""The bundle store on DuckDB: collect real bundles (IREE runs of the convnet and of
squeezenet in several modes, compile manifests, reconstructed Edge TPU / Cerebras /
SambaNova bundles), then check each named report against values computed here from
the bundles themselves."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from dfit_mlir.cli.app import main
from dfit_mlir.core.errors import InvalidInputError
from dfit_mlir.fleet import store as bundle_store
from tests.store_fixtures import *  # noqa: F403  (the store fixtures)
from tests.store_fixtures import SLOWED_ID

pytestmark = pytest.mark.slow


def rows(store_path: Path, sql: str | None = None, **report: Any) -> list[dict[str, Any]]:
    name = report.pop("report", None)
    return bundle_store.query(store_path, sql, report=name, parameters=report or None).to_pylist()


def events(bundle: Path) -> list[dict[str, Any]]:
    return pq.read_table(bundle / "events.parquet").to_pylist()


# --- collect ------------------------------------------------------------------------------

def test_store_holds_one_run_row_per_bundle_partitioned_by_backend_model_run(store: Path,
                                                                             store_bundles: dict[str, Any]) -> None:
    runs = rows(store, "SELECT backend, model, run, kind, label, host, rank, events FROM runs")
    assert len(runs) == 17
    assert {(r["backend"], r["kind"]) for r in runs} == {
        ("iree", "run"), ("iree", "compile"), ("edgetpu", "reconstruction"), ("cerebras", "reconstruction"),
        ("sambanova", "reconstruction")}
    assert sum(r["kind"] == "compile" for r in runs) == 2
    full = store_bundles["iree"]["full"]
    session = events(full)[0]["session"]
    (row,) = [r for r in runs if r["run"] == session]
    assert (row["backend"], row["model"], row["label"], row["events"]) == ("iree", "convnet", "base", len(events(full)))
    assert (store / "bundles" / "backend=iree" / "model=convnet" / f"run={session}" / "events.parquet").is_file()
    job = sorted((r["host"], r["rank"]) for r in runs if r["label"] == "job")
    assert job == [("node-a", 0), ("node-b", 1)]
    # Every event of a bundle is in the store, with where it ran.
    counted = rows(store, f"SELECT count(*) AS n, min(host) AS host FROM events WHERE run = '{session}'")
    assert counted == [{"n": len(events(full)), "host": None}]
    placed = rows(store, "SELECT DISTINCT host, rank FROM events WHERE model = 'convnet-dp' ORDER BY rank")
    assert placed == [{"host": "node-a", "rank": 0}, {"host": "node-b", "rank": 1}]


def test_compile_manifests_give_their_timed_phases(store: Path, store_bundles: dict[str, Any]) -> None:
    manifest = json.loads(store_bundles["squeezenet"]["manifest"].read_text())
    timed = {s["name"]: round(s["phase_s"] * 1e9) for s in manifest["stages"] if s.get("phase_s") is not None}
    got = rows(store, "SELECT e.stage, e.duration_ns FROM events e JOIN runs r ON r.run = e.run "
                      "WHERE r.kind = 'compile' AND e.model = 'onnx_squeezenet'")
    assert timed and {r["stage"]: r["duration_ns"] for r in got} == timed
    operators = rows(store, "SELECT count(*) AS n FROM operators o JOIN runs r ON r.run = o.run "
                            "WHERE r.kind = 'compile' AND o.model = 'onnx_squeezenet'")
    assert operators == [{"n": len(manifest["operators"])}]


def test_collect_is_idempotent_and_atomic_per_bundle(tmp_path: Path, iree_bundles: dict[str, Path]) -> None:
    target = tmp_path / "store"
    first = bundle_store.collect([iree_bundles["full"]], target, bundle_store.Placement(label="a"))
    again = bundle_store.collect([iree_bundles["full"]], target, bundle_store.Placement(label="b"))
    assert first[0].added and not again[0].added and again[0].run == first[0].run
    assert rows(target, "SELECT label FROM runs") == [{"label": "a"}]
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("manifest.json", "summary.json"):
        (broken / name).write_text((iree_bundles["lite"] / name).read_text())
    (broken / "events.parquet").write_bytes(b"PAR1 not parquet")
    with pytest.raises(InvalidInputError, match="broken/events.parquet: not a readable Parquet file"):
        bundle_store.collect([iree_bundles["lite"], broken], target)
    # Every bundle is checked before any is written: neither is in, no temporary directories left.
    assert len(rows(target, "SELECT run FROM runs")) == 1
    from dfit_mlir.core.outputs import MARKER

    leftovers = [p for p in target.rglob("*") if p.name.startswith(".") and p.name != MARKER]
    assert leftovers == []


def test_timing_only_runs_are_runs_of_their_own(tmp_path: Path, iree_bundles: dict[str, Path]) -> None:
    """A ``--mode none`` bundle has no events: it is neither its compile's manifest nor
    another baseline run of the same module (each was skipped as "already in the store")."""
    from dfit_mlir.runtime_hooks.run import run_bundle

    manifest = iree_bundles["manifest"]
    second_none = run_bundle(manifest.parent / "full.vmfb", manifest, tmp_path / "run-none-2", mode="none").bundle
    target = tmp_path / "store"
    added = bundle_store.collect([manifest, iree_bundles["none"], second_none], target)
    assert [entry.added for entry in added] == [True, True, True]
    assert len({entry.run for entry in added}) == 3
    kinds = sorted((row["kind"], row["mode"]) for row in rows(target, "SELECT kind, mode FROM runs"))
    assert kinds == [("compile", "full"), ("run", "none"), ("run", "none")]


def test_older_minor_still_reads(tmp_path: Path, iree_bundles: dict[str, Path]) -> None:
    """A bundle written with event schema 1.0 (no name/value/step) and a store file
    missing the columns the store added later both read with those columns null."""
    old = tmp_path / "old-bundle"
    import shutil

    shutil.copytree(iree_bundles["full"], old)
    table = pq.read_table(old / "events.parquet").drop_columns(["name", "value", "step"])
    table = table.replace_schema_metadata({**table.schema.metadata, b"dfit.version": b"1.0"})
    pq.write_table(table, old / "events.parquet")
    target = tmp_path / "store"
    (done,) = bundle_store.collect([old], target)
    assert rows(target, "SELECT event_schema FROM runs") == [{"event_schema": "1.0"}]
    stored = next(target.rglob("events.parquet"))
    pq.write_table(pq.read_table(stored).drop_columns(["run_scope", "pid", "value"]), stored)
    got = rows(target, "SELECT count(*) AS n, count(step) AS steps, count(value) AS values_, count(pid) AS pids "
                       "FROM events")
    assert got == [{"n": done.events, "steps": 0, "values_": 0, "pids": 0}]
    assert rows(target, report="top-sites", limit=1)


# --- reports --------------------------------------------------------------------------------

def ledger_entries(bundle: Path) -> list[dict[str, Any]]:
    """The bundle's ledger entries as dfit analyze / show compute them (not the store's)."""
    from dfit_mlir.analysis.ledger import Ledger
    from dfit_mlir.analysis.model import SemanticModel

    model = SemanticModel.open(bundle)
    found = Ledger(model).entries.to_pylist()
    for row in found:
        source = model.operators[row["op_id"]].source or {}
        row["location"] = row["module_path"] or (f"{source['file']}:{source['line']}" if source.get("file")
                                                 and source.get("line") is not None else row["op_id"])
        row["session"] = bundle
    return found


def test_top_sites_is_the_ledgers_time_by_source_line_across_runs(store: Path, store_bundles: dict[str, Any]) -> None:
    """Each location's time is the sum of its ops' ledger entries (their shares of their
    dispatches' time) over the runs, computed here by dfit_mlir.analysis.ledger from the bundles."""
    iree, convnet = store_bundles["iree"], store_bundles["convnet"]
    expected: dict[str, float] = defaultdict(float)
    runs: dict[str, set[Any]] = defaultdict(set)
    calls: dict[str, dict[tuple[Any, str], int]] = defaultdict(dict)
    entries: dict[str, int] = defaultdict(int)
    for bundle in (iree["full"], convnet["rerun0"], convnet["slow0"], convnet["slow1"], convnet["same0"],
                   convnet["same1"], iree["lite"]):
        for entry in ledger_entries(bundle):
            if entry["calls"]:
                expected[entry["location"]] += entry["time_ns"]
                entries[entry["location"]] += 1
                runs[entry["location"]].add(bundle)
                calls[entry["location"]][(bundle, entry["partition"])] = entry["calls"]
    got = [r for r in rows(store, report="top-sites", limit=1000) if r["model"] == "convnet"]
    assert {r["location"] for r in got} == set(expected)
    for row in got:  # whole ns per entry: within 1 ns of the ledger's share per entry
        assert abs(row["total_ns"] - expected[row["location"]]) <= entries[row["location"]]
        assert row["events"] == sum(calls[row["location"]].values())
    assert {r["location"]: r["runs"] for r in got} == {k: len(v) for k, v in runs.items()}
    assert [r["total_ns"] for r in got] == sorted((r["total_ns"] for r in got), reverse=True)
    assert sum(r["attributed_share"] for r in got) == pytest.approx(1.0, abs=1e-6)
    squeezenet = [r for r in rows(store, report="top-sites", limit=1000) if r["model"] == "onnx_squeezenet"]
    assert squeezenet and all(r["runs"] == 1 for r in squeezenet)  # only the full run has per-dispatch times


def test_regressions_report_only_changes_outside_the_runs_spread(store: Path, store_bundles: dict[str, Any]) -> None:
    """The slowed ID's dispatch is 3x slower: every op of it (its ledger entries), each by
    its share, and nothing else."""
    full = store_bundles["iree"]["full"]
    slowed_partitions = {e["partition"] for e in ledger_entries(full) if e["op_id"] == SLOWED_ID}
    in_dispatch = {e["op_id"] for e in ledger_entries(full) if e["partition"] in slowed_partitions and e["time_ns"]}
    found = rows(store, report="regressions", baseline="base", candidate="slow")
    assert SLOWED_ID in in_dispatch and {r["op_id"] for r in found} == in_dispatch
    for row in found:
        assert (row["model"], row["change"], row["baseline_runs"], row["candidate_runs"]) == \
            ("convnet", "slower", 2, 2)
        assert row["ratio"] == pytest.approx(3.0, abs=2e-3)
    (row,) = [r for r in found if r["op_id"] == SLOWED_ID]
    per_run = [sum(e["time_ns"] for e in ledger_entries(b) if e["op_id"] == SLOWED_ID) / 3
               for b in (full, store_bundles["convnet"]["rerun0"])]
    assert row["baseline_ns"] == pytest.approx(statistics.mean(per_run), abs=1.0)
    assert rows(store, report="regressions", baseline="base", candidate="same") == []
    # The other direction is a speed-up of the same size.
    back = rows(store, report="regressions", baseline="slow", candidate="base")
    assert {r["op_id"] for r in back} == in_dispatch and {r["change"] for r in back} == {"faster"}
    # One run per side: the spread is unknown, nothing is reported unless asked.
    assert rows(store, report="regressions", baseline="base", candidate="lite", min_runs=2) == []


def test_rank_skew_compares_the_slowest_rank_with_the_median(store: Path, store_bundles: dict[str, Any]) -> None:
    per_rank = []
    for bundle in (store_bundles["convnet"]["rerun1"], store_bundles["iree"]["ids"]):
        spans: dict[int, list[int]] = defaultdict(list)
        for event in events(bundle):
            if event["invocation"] is not None and event["start_ns"] is not None:
                spans[event["invocation"]] += [event["start_ns"], event["start_ns"] + (event["duration_ns"] or 0)]
        per_rank.append({step: max(v) - min(v) for step, v in spans.items()})
    report = rows(store, report="rank-skew")
    got = [r for r in report if r["label"] == "job"]
    assert [(r["measure"], r["unit"], r["step"]) for r in got] == [("step_span", "ns", step) for step in (0, 1, 2)]
    for row in got:
        times = [per_rank[0][row["step"]], per_rank[1][row["step"]]]
        assert (row["ranks"], row["job_ranks"], row["note"]) == (2, 2, None)
        assert row["slowest"] == max(times) and row["fastest"] == min(times)
        assert row["slowest_rank"] == times.index(max(times))
        assert row["median"] == pytest.approx(statistics.median(times))
        assert row["skew"] == pytest.approx(max(times) / statistics.median(times), abs=1e-3)
    # The other multi-task job of the store: the SambaFlow dp8 run's tasks (tests/test_rank_skew.py).
    assert {(r["label"], r["model"]) for r in report} == {("job", "convnet-dp"),
                                                          ("vendor", "bertlarge_compile_sf1.17.7_sn30")}


def test_coverage_states_what_each_backend_exposed(store: Path, store_bundles: dict[str, Any]) -> None:
    got = rows(store, report="coverage")
    by = {(r["backend"], r["aspect"], r["status"]): r for r in got}
    edgetpu = json.loads((store_bundles["edgetpu"] / "coverage.json").read_text())
    for aspect, status in edgetpu["aspects"].items():
        assert by[("edgetpu", aspect, status)]["runs"] == 1
    said: dict[tuple[str, str], int] = defaultdict(int)
    for name in ("sambanova", "sambanova_mnist"):
        for aspect, status in json.loads((store_bundles[name] / "coverage.json").read_text())["aspects"].items():
            said[(aspect, status)] += 1
    assert {(a, s): r["runs"] for (b, a, s), r in by.items() if b == "sambanova" and s != "observed"} == dict(said)
    assert said[("per_program_timing", "recovered")] >= 1
    assert by[("iree", "per_op_timing", "exposed")]["runs"] == 13  # 11 runs, 2 compile manifests
    metrics = sum(e["kind"] == "metric" for b in ("sambanova", "sambanova_mnist") for e in events(store_bundles[b]))
    assert by[("sambanova", "events.metric", "observed")]["events"] == metrics
    dispatches = by[("iree", "events.dispatch", "observed")]
    assert dispatches["events"] == dispatches["timed"] == dispatches["with_id"] > 0
    assert ("cerebras", "events.dispatch", "observed") not in by


# --- the command line ------------------------------------------------------------------------

def test_cli_collect_query_outputs_and_errors(tmp_path: Path, store: Path, iree_bundles: dict[str, Path]) -> None:
    runner = CliRunner()
    target = tmp_path / "s"
    result = runner.invoke(main, ["collect", str(iree_bundles["full"]), "-o", str(target), "--label", "x",
                                  "--host", "h", "--rank", "3"])
    assert result.exit_code == 0, result.output
    assert "added" in result.output and "backend=iree/model=convnet" in result.output
    out = tmp_path / "top.csv"
    result = runner.invoke(main, ["query", str(store), "top-sites", "--limit", "3", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text().count("\n") == 4 and "(3 rows)" in result.output
    parquet = tmp_path / "kinds.parquet"
    result = runner.invoke(main, ["query", str(store), "SELECT kind, count(*) AS n FROM events GROUP BY kind "
                                  "ORDER BY kind", "-o", str(parquet)])
    assert result.exit_code == 0 and "dispatch" in result.output
    assert "metric" in pq.read_table(parquet).column("kind").to_pylist()
    trace = tmp_path / "dispatches.pftrace"
    result = runner.invoke(main, ["query", str(store), "SELECT * FROM events WHERE kind = 'dispatch' AND "
                                  "model = 'convnet' AND run IN (SELECT run FROM runs WHERE label = 'base')",
                                  "--trace", str(trace), "--rows", "0"])
    assert result.exit_code == 0, result.output
    from tests.conftest import read_pftrace

    tracks, traced = read_pftrace(trace)
    dispatches = sum(e["kind"] == "dispatch" for b in ("full",) for e in events(iree_bundles[b])) * 2
    assert sum(p.track_event.type == p.track_event.TYPE_SLICE_BEGIN for p, _, _ in traced) == dispatches
    assert sum(name.startswith("convnet · run ") for name in tracks.values()) == 2  # model · run, per run
    for args, message in (
        ([str(store), "SELECT nope FROM events"], 'query failed (duckdb): Binder Error: Referenced column "nope"'),
        ([str(store), "regressions", "--baseline", "base"], "report regressions needs --candidate"),
        ([str(store), "SELECT 1", "--limit", "2"], "go with a named report"),
        ([str(tmp_path / "none"), "top-sites"], "not a dfit store"),
        ([str(store), "SELECT kind FROM events LIMIT 1", "--trace", str(tmp_path / "t.pftrace")], "--trace needs"),
    ):
        result = runner.invoke(main, ["query", *args])
        assert result.exit_code == 2 and message in result.output, result.output
        assert "Traceback" not in result.output
    (tmp_path / "notes").mkdir()
    result = runner.invoke(main, ["collect", str(tmp_path / "notes"), "-o", str(tmp_path / "s2")])
    assert result.exit_code == 2 and "not a dfit bundle" in result.output
    result = runner.invoke(main, ["collect", str(tmp_path), "-o", str(tmp_path / "s2")])  # a store in its input
    assert result.exit_code == 2 and "refusing to write an output inside the input" in result.output


def test_collect_refuses_a_directory_that_is_not_a_store(tmp_path: Path, iree_bundles: dict[str, Path]) -> None:
    (tmp_path / "mine.txt").write_text("user data")
    with pytest.raises(InvalidInputError, match="exists and is not a dfit store"):
        bundle_store.collect([iree_bundles["full"]], tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]


def test_dialect_literals_round_trip_on_duckdb(tmp_path: Path, iree_bundles: dict[str, Path]) -> None:
    from dfit_mlir.fleet.store import dialects, engines

    bundle_store.collect([iree_bundles["full"]], tmp_path / "s")
    engine = engines.DuckDBEngine(str(tmp_path / "s"))
    tricky = "it's a \\path\\ 'quoted'"
    got = engine.sql(f"SELECT {engine.dialect.literal(tricky)} AS s, get_json_object('{{\"a\": 3}}', '$.a') AS j, "
                     "'a' || NULL AS joined").to_pylist()
    assert got == [{"s": tricky, "j": "3", "joined": None}]
    assert dialects.SPARK.literal(tricky) == "'it''s a \\\\path\\\\ ''quoted'''"
    assert pa.types.is_int64(engine.sql("SELECT CAST(SUM(duration_ns) AS BIGINT) AS t FROM events").schema[0].type)


def test_collect_says_what_it_does_not_apply(tmp_path: Path, iree_bundles: dict[str, Path]) -> None:
    """A placement given for a bundle already stored is not applied, and a --model that is
    not a valid partition value is stored under another name: both are said, on stderr."""
    from click.testing import CliRunner

    from dfit_mlir.cli.app import main

    runner = CliRunner()
    store = tmp_path / "store"
    added = runner.invoke(main, ["collect", str(iree_bundles["full"]), "-o", str(store), "--model", "o'neil/v2"])
    assert added.exit_code == 0 and "model=o_neil_v2" in added.stdout
    assert "--model \"o'neil/v2\" is stored as model=o_neil_v2" in added.stderr
    again = runner.invoke(main, ["collect", str(iree_bundles["full"]), "-o", str(store), "--label", "other"])
    assert again.exit_code == 0 and "already in the store" in again.stdout
    assert "--label given now are not applied" in again.stderr
    assert rows(store, "SELECT label FROM runs") == [{"label": None}]


def test_collect_names_a_damaged_stored_bundle(tmp_path: Path, iree_bundles: dict[str, Path]) -> None:
    """A stored bundle whose events file went missing is not reported as stored with 0 events."""
    store = tmp_path / "store"
    done = bundle_store.collect([iree_bundles["full"]], store)[0]
    stored = next((store / "bundles").glob(f"*/*/run={done.run}"))
    (stored / "events.parquet").unlink()
    with pytest.raises(InvalidInputError, match="stored bundle is damaged .*events.parquet is missing"):
        bundle_store.collect([iree_bundles["full"]], store)
