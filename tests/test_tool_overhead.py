"""overhead: compile snapshot time per stage, runtime slowdown against a baseline run of
the same model, trace size and event counts, on every backend's bundle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from dfit_mlir.analysis.tools.builtin.overhead import NOT_MEASURABLE
from dfit_mlir.analysis.tools.session import analyze
from dfit_mlir.core.errors import InvalidInputError
from tests.conftest import bundle_path, read_csv

BUNDLES = ("iree-full", "iree-lite", "iree-ids", "iree-none", "iree-manifest", "edgetpu", "sambanova", "cerebras")
RATIO_COLUMNS = ("baseline", "slowdown", "extra_ms")


def run(bundle: Path, out: Path, **options: Any) -> tuple[Path, list[str]]:
    _, _, session = analyze(bundle, ["overhead"], out, {"overhead": options} if options else None)
    return out / "overhead", session.contexts["overhead"].notes


def summary_of(bundle: Path) -> dict[str, Any]:
    return json.loads((bundle / "summary.json").read_text())


@pytest.mark.parametrize("name", BUNDLES)
def test_every_bundle_reports_its_tracing_cost(request: pytest.FixtureRequest, name: str, tmp_path: Path) -> None:
    bundle = bundle_path(request, name)
    out, _ = run(bundle, tmp_path)
    assert all((out / f).is_file() for f in ("overhead.csv", "overhead.json", "compile.csv", "summary.json"))
    (row,) = read_csv(out / "overhead.csv")
    assert row["role"] == "this"
    if bundle.is_dir():
        events = pq.read_metadata(bundle / "events.parquet").num_rows
        sizes = [(bundle / f).stat().st_size for f in ("trace.pftrace", "trace.json", "events.parquet")]
        assert (int(row["events"]), int(row["dropped"])) == (events, 0)
        assert (int(row["pftrace_bytes"]), int(row["json_bytes"]), int(row["parquet_bytes"]),
                int(row["trace_bytes"])) == (*sizes, sum(sizes))
    else:  # a bare manifest: nothing ran
        assert (row["events"], row["trace_bytes"], row["invocation_ms"], row["invocation_statistic"]) == ("0", "", "", "")
    assert json.loads((out / "summary.json").read_text())["analysis_s"] > 0


def test_full_run_against_none_ids_and_lite(iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    compare = [iree_bundles[mode] for mode in ("none", "ids", "lite")]
    out, notes = run(iree_bundles["full"], tmp_path, compare=",".join(map(str, compare)))
    rows = {row["mode"]: row for row in read_csv(out / "overhead.csv")}
    assert list(rows) == ["full", "none", "ids", "lite"]
    full = rows["full"]
    summary = summary_of(iree_bundles["full"])
    assert int(full["events"]) == summary["counts"]["kept"]
    kinds = pq.read_table(iree_bundles["full"] / "events.parquet", columns=["kind"]).column("kind").to_pylist()
    assert kinds.count("dispatch") == 6 * 3  # 6 dispatch sites, 3 recorded invocations; queue/memory records vary
    assert int(full["dropped"]) == 0
    # The full run is the only one iree-benchmark-module timed: nothing to compare it with,
    # so no ratio (never "1.00x") and the reason instead.
    assert all(full[column] == "" for column in RATIO_COLUMNS)
    assert full["not_compared"] == "no other run of this model was timed by iree-benchmark-module"
    # In-process runs are compared with the `none` run, the least instrumented one; the
    # full run is timed by iree-benchmark-module, so nothing in process is its baseline.
    assert {mode: rows[mode]["harness"] for mode in rows} == {
        "full": "iree-benchmark-module", "none": "in-process", "ids": "in-process", "lite": "in-process"}
    assert {rows[mode]["baseline"] for mode in ("none", "ids", "lite")} == {"none"}
    assert float(rows["none"]["slowdown"]) == 1.0
    none_median = summary_of(iree_bundles["none"])["invocation_ns"]["median"]
    lite_median = summary_of(iree_bundles["lite"])["invocation_ns"]["median"]
    assert float(rows["lite"]["slowdown"]) == pytest.approx(lite_median / none_median, rel=1e-3)
    _, _, session = analyze(iree_bundles["full"], ["overhead"], tmp_path / "again",
                            {"overhead": {"compare": ",".join(map(str, compare))}})
    report = session.tools[0].report(session.contexts["overhead"])
    full_line = next(line for line in report.splitlines() if line.startswith("full "))
    assert "1.00x" not in full_line and "not compared: no other run" in full_line
    assert "baseline" in next(line for line in report.splitlines() if line.startswith("none "))
    assert any("timed by iree-benchmark-module" in note for note in notes)
    # iree-benchmark-module gives a mean per invocation and nothing else: the summary holds
    # only that, and the row and the report say it is a mean (an in-process run's a median).
    assert set(summary["invocation_ns"]) == {"count", "mean"}
    assert (float(full["invocation_ms"]), full["invocation_statistic"]) == (summary["invocation_ns"]["mean"] / 1e6,
                                                                           "mean")
    assert float(rows["lite"]["invocation_ms"]) == lite_median / 1e6 and rows["lite"]["invocation_statistic"] == "median"
    assert f"{summary['invocation_ns']['mean'] / 1e6:.3f} (mean)" in full_line
    # Event rate: events per second of the invocations dfit recorded (count x mean).
    run_s = summary["invocation_ns"]["count"] * summary["invocation_ns"]["mean"] / 1e9
    assert float(full["event_rate_per_s"]) == pytest.approx(len(kinds) / run_s, rel=1e-3)
    assert {row["model"] for row in rows.values()} == {"convnet.mlir"}
    assert json.loads((out / "overhead.json").read_text())[0]["mode"] == "full"
    assert not any("no baseline" in note for note in notes)


def test_compile_snapshot_overhead(iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    manifest = json.loads(iree_bundles["manifest"].read_text())
    out, _ = run(iree_bundles["manifest"], tmp_path)
    stages = read_csv(out / "compile.csv")
    assert [row["stage"] for row in stages] == [stage["name"] for stage in manifest["stages"]]
    hal = next(stage for stage in manifest["stages"] if stage["name"] == "hal")
    hal_row = next(row for row in stages if row["stage"] == "hal")
    assert float(hal_row["snapshot_pct_of_phase"]) == round(100 * hal["snapshot_s"] / hal["phase_s"], 2)
    compile_totals = json.loads((out / "summary.json").read_text())["compile"]
    snapshots = sum(stage["snapshot_s"] for stage in manifest["stages"])
    assert compile_totals["snapshot_total_s"] == pytest.approx(snapshots, abs=1e-6)
    assert compile_totals["compile_total_s"] == manifest["compile"]["total_s"]


@pytest.mark.parametrize("name", ("edgetpu", "sambanova", "cerebras"))
def test_reconstructed_bundles_degrade(request: pytest.FixtureRequest, name: str, tmp_path: Path) -> None:
    bundle = bundle_path(request, name)
    out, notes = run(bundle, tmp_path)
    assert NOT_MEASURABLE in notes
    (row,) = read_csv(out / "overhead.csv")
    assert row["mode"] == "reconstructed" and row["invocation_ms"] == "" and row["slowdown"] == ""
    assert int(row["events"]) == summary_of(bundle)["counts"]["kept"] > 0
    assert int(row["trace_bytes"]) > 0
    assert read_csv(out / "compile.csv") == []


def test_a_run_of_another_model_is_not_its_baseline(iree_bundles: dict[str, Path], edgetpu_bundle: Path,
                                                     tmp_path: Path) -> None:
    out, notes = run(iree_bundles["lite"], tmp_path, compare=[iree_bundles["none"], edgetpu_bundle])
    rows = read_csv(out / "overhead.csv")
    assert [(row["mode"], row["model"]) for row in rows] == [
        ("lite", "convnet.mlir"), ("none", "convnet.mlir"), ("reconstructed", "goalbuddy_yolov8_v16")]
    assert rows[0]["baseline"] == "none" and rows[2]["baseline"] == ""
    assert any("not a run of this model" in note for note in notes)


@pytest.mark.parametrize(("options", "message"), [
    ({"compare": " , "}, "names no bundle"),
    ({"compare": "/nonexistent/bundle"}, "no such file"),
    ({"baseline": "x"}, "unknown option"),
])
def test_bad_options_are_one_line_errors(iree_bundles: dict[str, Path], tmp_path: Path, options: dict[str, str],
                                         message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        run(iree_bundles["full"], tmp_path, **options)
