"""``dfit merge`` on two real IREE runs of one module started with different clocks (one
bundle's times shifted by 5 s, as on another host), on bundles that recorded their clock
offsets, and on the SambaFlow data-parallel run log's tasks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from dfit_mlir.cli.app import main
from dfit_mlir.core.errors import InvalidInputError
from dfit_mlir.fleet.merge import merge_bundles
from tests.conftest import read_csv
from tests.store_fixtures import convnet_runs, copy_bundle  # noqa: F401  (fixture)

SHIFT_NS = 5_000_000_000


def first_start(bundle: Path, invocation: int = 0) -> int:
    return min(e["start_ns"] for e in pq.read_table(bundle / "events.parquet").to_pylist()
               if e["invocation"] == invocation and e["start_ns"] is not None)


@pytest.fixture(scope="module")
def shifted(tmp_path_factory: pytest.TempPathFactory, convnet_runs: dict[str, Path]) -> Path:  # noqa: F811
    return copy_bundle(convnet_runs["rerun1"], tmp_path_factory.mktemp("shifted") / "rank1", shift_ns=SHIFT_NS)


def test_two_runs_with_different_clocks_on_one_timeline(tmp_path: Path, convnet_runs: dict[str, Path],  # noqa: F811
                                                        shifted: Path) -> None:
    rank0, rank1 = convnet_runs["rerun0"], convnet_runs["rerun1"]
    summary = merge_bundles([rank0, shifted], tmp_path / "merged")
    alignment = summary["alignment"]
    assert alignment["method"] == "anchor: first common step (0)" and alignment["common_steps"] == 3
    # The shift is undone: rank 1's offset is the 5 s plus the real gap between the two runs' first invocations.
    expected = first_start(rank0) - (first_start(rank1) + SHIFT_NS)
    assert [r["offset_ns"] for r in summary["ranks"]] == [0, expected]
    assert [r["group"] for r in summary["ranks"]] == ["rank 0", "rank 1"]
    merged = pq.read_table(tmp_path / "merged" / "events.parquet").to_pylist()
    # The merged bundle is a bundle of its own; its events name their rank.
    assert {e["session"] for e in merged} == {summary["session"]} and summary["session"].startswith("merge-")
    assert len(summary["source_sessions"]) == 2
    rank_of = [json.loads(e["attributes"])["rank"] for e in merged]
    assert rank_of.count(0) == pq.read_metadata(rank0 / "events.parquet").num_rows
    starts = [min(e["start_ns"] for e, r in zip(merged, rank_of, strict=True) if r == k and e["invocation"] == 0) for k in (0, 1)]
    assert starts[0] == starts[1] == first_start(rank0)
    assert (tmp_path / "merged" / "sites.parquet").is_file()  # a bundle the analysis tools read
    # The residual: how far the later invocations still differ once invocation 0 is aligned.
    later = sorted(abs((first_start(rank1, k) - first_start(rank1)) - (first_start(rank0, k) - first_start(rank0)))
                   for k in (1, 2))
    assert alignment["residual_ns"] == (later[0] + later[1]) // 2
    steps = read_csv(tmp_path / "merged" / "steps.csv")
    assert [int(row["step"]) for row in steps] == [0, 1, 2]
    assert int(steps[0]["spread_ns"]) == 0
    for row in steps[1:]:
        k = int(row["step"])
        gap = (first_start(rank1, k) - first_start(rank1)) - (first_start(rank0, k) - first_start(rank0))
        assert int(row["spread_ns"]) == abs(gap)
        assert row["last_rank"] == ("rank 1" if gap > 0 else "rank 0")
    from tests.conftest import read_pftrace

    tracks, events = read_pftrace(tmp_path / "merged" / "trace.pftrace")
    assert {"rank 0", "rank 1"} <= set(tracks.values())
    flows: dict[int, list[int]] = {}
    for packet, _, _ in events:
        for flow in packet.track_event.flow_ids:
            flows.setdefault(flow, []).append(packet.track_event.track_uuid)
    assert len(flows) == 3 and all(len(uuids) == 2 and len(set(uuids)) == 2 for uuids in flows.values())
    assert summary["trace_slices"] == len(merged)
    # Written through the run bundle's own writer: the same files, the Chrome trace too,
    # each rank a process group of its own, and the CSVs counting every merged event.
    run_files = {p.name for p in rank0.iterdir() if not p.name.startswith(".")}
    merged_files = {p.name for p in (tmp_path / "merged").iterdir() if not p.name.startswith(".")}
    assert run_files <= merged_files and merged_files - run_files == {"steps.csv"}
    chrome = json.loads((tmp_path / "merged" / "trace.json").read_text())["traceEvents"]
    assert sum(1 for e in chrome if e.get("ph") in ("X", "i")) == len(merged)
    counts = read_csv(tmp_path / "merged" / "events.csv")
    assert sum(int(row["duration_ns_count"]) for row in counts) == sum(1 for e in merged if e["duration_ns"] is not None)
    assert summary["toolchain"] == json.loads((rank0 / "summary.json").read_text())["toolchain"]


def test_recorded_offsets_win_over_anchors(tmp_path: Path, convnet_runs: dict[str, Path], shifted: Path) -> None:  # noqa: F811
    """SYNTHETIC: the two bundles' summaries given clock offsets as a time-synced host would record them."""
    bundles = []
    for name, source, offset in (("a", convnet_runs["rerun0"], 0), ("b", shifted, -SHIFT_NS)):
        bundle = copy_bundle(source, tmp_path / name)
        summary = json.loads((bundle / "summary.json").read_text())
        summary.update(clock_offset_ns=offset, host=f"node-{name}")
        (bundle / "summary.json").write_text(json.dumps(summary))
        bundles.append(bundle)
    summary = merge_bundles(bundles, tmp_path / "merged")
    assert summary["alignment"]["method"] == "recorded offsets (summary.clock_offset_ns)"
    assert [(r["group"], r["offset_ns"]) for r in summary["ranks"]] == \
        [("host node-a · rank 0", 0), ("host node-b · rank 1", -SHIFT_NS)]
    result = CliRunner().invoke(main, ["merge", str(bundles[0]), str(bundles[1]), "-o", str(tmp_path / "cli"),
                                       "--anchor", "dispatch"])
    assert result.exit_code == 0 and "clocks aligned by recorded offsets" in result.output


def test_anchor_option_and_errors(tmp_path: Path, convnet_runs: dict[str, Path], shifted: Path) -> None:  # noqa: F811
    summary = merge_bundles([convnet_runs["rerun0"], shifted], tmp_path / "m", anchor="queue")
    queue = [min(e["start_ns"] for e in pq.read_table(b / "events.parquet").to_pylist() if e["kind"] == "queue")
             for b in (convnet_runs["rerun0"], shifted)]
    assert summary["alignment"]["method"] == "anchor: first queue event of every rank"
    assert summary["ranks"][1]["offset_ns"] == queue[0] - queue[1]
    with pytest.raises(InvalidInputError, match="KIND is one of"):
        merge_bundles([convnet_runs["rerun0"], shifted], tmp_path / "x", anchor="steps")
    with pytest.raises(InvalidInputError, match="no such event on rank 0"):
        merge_bundles([convnet_runs["rerun0"], shifted], tmp_path / "x", anchor="tensor")
    runner = CliRunner()
    result = runner.invoke(main, ["merge", str(shifted), "-o", str(shifted)])
    assert result.exit_code == 2 and "refusing to write an output over the input" in result.output
    (tmp_path / "empty").mkdir()
    result = runner.invoke(main, ["merge", str(tmp_path / "empty"), "-o", str(tmp_path / "y")])
    assert result.exit_code == 2 and "not a dfit run or reconstruct bundle" in result.output
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_sambaflow_data_parallel_tasks(tmp_path: Path, sambanova_bundle: Path) -> None:
    """The 8-task BertLarge run log: a rank per task, by its rank attribute where the
    reader tagged one, else its pid; every task's events on that task's track group."""
    events = pq.read_table(sambanova_bundle / "events.parquet").to_pylist()
    expected: dict[str, int] = {}
    for event in events:
        attributes: dict[str, Any] = json.loads(event["attributes"] or "{}")
        key = (f"rank {attributes['rank']}" if isinstance(attributes.get("rank"), int) else
               f"task pid {attributes['pid']}" if isinstance(attributes.get("pid"), int) else "bundle: no task")
        expected[key] = expected.get(key, 0) + 1
    summary = merge_bundles([sambanova_bundle], tmp_path / "merged")
    assert {r["group"]: r["events"] for r in summary["ranks"]} == expected
    steps = {e["step"] for e in events if e["step"] is not None}
    if len(summary["ranks"]) == 1:  # one task logs the steps: nothing to align it with
        assert summary["alignment"]["common_steps"] == len(steps) > 500
    from tests.conftest import read_pftrace

    tracks, traced = read_pftrace(tmp_path / "merged" / "trace.pftrace")
    timed = {key for key in expected if key != "bundle: no task"}  # the compile log's figures have no time
    assert timed and timed <= set(tracks.values())
    assert len(traced) == sum(e["start_ns"] is not None for e in events) + \
        sum(e["start_ns"] is not None and (e["duration_ns"] or 0) > 0 for e in events)


# --- one job only ----------------------------------------------------------------------

def test_bundles_of_different_backends_are_refused(tmp_path: Path, sambanova_bundle: Path,
                                                   convnet_runs: dict[str, Path]) -> None:  # noqa: F811
    """A reconstructed SambaNova BERT log and a local IREE run are not one job: exit 2 on
    one line naming both, nothing written; --allow-mixed merges them and says plainly
    that no anchor aligned their clocks (no "residual None ns")."""
    iree = convnet_runs["rerun0"]
    runner = CliRunner()
    result = runner.invoke(main, ["merge", str(sambanova_bundle), str(iree), "-o", str(tmp_path / "m")])
    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert str(sambanova_bundle) in line and str(iree) in line
    assert "different backends (sambanova, iree)" in line and "--allow-mixed" in line
    assert not (tmp_path / "m").exists()
    result = runner.invoke(main, ["merge", str(sambanova_bundle), str(iree), "-o", str(tmp_path / "m"),
                                  "--allow-mixed"])
    assert result.exit_code == 0, result.output
    assert "None" not in result.output and "[mixed models/backends: --allow-mixed]" in result.output
    summary = json.loads((tmp_path / "m" / "summary.json").read_text())
    assert summary["mixed"] is True
    # The log's compile-time rank has no timed event: no anchor common to every rank.
    assert summary["alignment"]["aligned"] is False and summary["alignment"]["residual_ns"] is None
    assert "clocks NOT aligned" in result.output and "each rank keeps its own clock" in result.output


def test_bundles_of_different_models_are_refused(tmp_path: Path, convnet_runs: dict[str, Path]) -> None:  # noqa: F811
    """SYNTHETIC: the convnet run's copy with another compiled source's hash stands for
    a run of another model on the same backend."""
    rank0 = convnet_runs["rerun0"]
    other = copy_bundle(convnet_runs["rerun1"], tmp_path / "other")
    document = json.loads((other / "manifest.json").read_text())
    document["input"] = {**document["input"], "path": "/models/other.mlir", "sha256": "0" * 64}
    (other / "manifest.json").write_text(json.dumps(document))
    with pytest.raises(InvalidInputError, match=r"are not runs of one job: different models \(.*, /models/other.mlir\)"):
        merge_bundles([rank0, other], tmp_path / "m")
    summary = merge_bundles([rank0, other], tmp_path / "m", allow_mixed=True)
    assert summary["mixed"] is True and len(summary["ranks"]) == 2
    # Two runs of one compile are one job, whatever their hosts: not mixed.
    assert merge_bundles([rank0, convnet_runs["rerun1"]], tmp_path / "same")["mixed"] is False


def test_one_rank_has_nothing_to_align(tmp_path: Path, edgetpu_bundle: Path) -> None:
    result = CliRunner().invoke(main, ["merge", str(edgetpu_bundle), "-o", str(tmp_path / "m")])
    assert result.exit_code == 0 and "1 ranks, one rank: no clocks to align" in result.output
    assert "None" not in result.output


def test_merged_bundle_is_analyzed_and_collected_as_its_own_run(tmp_path: Path, convnet_runs: dict[str, Path],  # noqa: F811
                                                                shifted: Path) -> None:
    """A merged job is a bundle like any other: the analysis tools read it, and a store
    keeps it apart from its sources, with its ranks (rank-skew compares them)."""
    merged = tmp_path / "merged"
    merge_bundles([convnet_runs["rerun0"], shifted], merged)
    runner = CliRunner()
    result = runner.invoke(main, ["analyze", str(merged), "--tool", "semantic-attribution",
                                  "--out", str(tmp_path / "analysis")])
    assert result.exit_code == 0, result.output
    store = tmp_path / "store"
    for bundle in (convnet_runs["rerun0"], merged):
        result = runner.invoke(main, ["collect", str(bundle), "-o", str(store)])
        assert result.exit_code == 0 and "already" not in result.output, result.output
    result = runner.invoke(main, ["query", str(store), "SELECT run, rank, COUNT(*) AS n FROM events "
                                  "WHERE run LIKE 'merge-%' GROUP BY run, rank ORDER BY rank",
                                  "-o", str(tmp_path / "ranks.csv")])
    assert result.exit_code == 0, result.output
    assert [row["rank"] for row in read_csv(tmp_path / "ranks.csv")] == ["0", "1"]


def test_a_bundle_given_twice_is_refused(tmp_path: Path, convnet_runs: dict[str, Path]) -> None:  # noqa: F811
    bundle = convnet_runs["rerun0"]
    result = CliRunner().invoke(main, ["merge", str(bundle), str(bundle), "-o", str(tmp_path / "m")])
    assert result.exit_code == 2 and "given twice" in result.output
    assert not (tmp_path / "m").exists()


def test_runs_record_their_placement_for_merge(tmp_path: Path, iree_bundles: dict[str, Path]) -> None:
    """`dfit run --host --rank --clock-offset-ns` keeps where a run ran in summary.json;
    merge then ranks by it and aligns by the recorded offsets."""
    vmfb = iree_bundles["manifest"].parent / "full.vmfb"
    runner = CliRunner()
    for rank in (0, 1):
        result = runner.invoke(main, ["run", str(vmfb), "--manifest", str(iree_bundles["manifest"]), "--host",
                                      f"node-{rank}", "--rank", str(rank), "--clock-offset-ns", str(rank * 1000),
                                      "-o", str(tmp_path / f"r{rank}")])
        assert result.exit_code == 0, result.output
        summary = json.loads((tmp_path / f"r{rank}" / "summary.json").read_text())
        assert (summary["host"], summary["rank"], summary["clock_offset_ns"]) == (f"node-{rank}", rank, rank * 1000)
    merged = merge_bundles([tmp_path / "r1", tmp_path / "r0"], tmp_path / "m")
    assert merged["alignment"]["method"].startswith("recorded offsets")
    assert [(r["host"], r["rank"], r["ranked_by"], r["offset_ns"]) for r in merged["ranks"]] == \
        [("node-1", 1, "summary", 1000), ("node-0", 0, "summary", 0)]
    result = runner.invoke(main, ["run", str(vmfb), "--manifest", str(iree_bundles["manifest"]), "--rank", "-1",
                                  "-o", str(tmp_path / "bad")])
    assert result.exit_code == 2 and not (tmp_path / "bad").exists()
