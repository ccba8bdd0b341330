"""compile-metrics on every backend's bundle: per-stage counts, lineage, materialised ops,
partitions and phase times, checked against figures derived here from the manifest."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dfit_mlir.analysis.tools.session import analyze
from dfit_mlir.core.errors import InvalidInputError
from tests.conftest import bundle_path, read_csv

OUTPUTS = ("stages.csv", "phases.csv", "materialised.csv")
BUNDLES = ("iree-full", "iree-lite", "iree-ids", "iree-none", "iree-manifest", "edgetpu", "sambanova", "cerebras")


def manifest_of(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json" if bundle.is_dir() else bundle).read_text())


def run(bundle: Path, out: Path, **options: str) -> tuple[Path, list[str]]:
    _, _, session = analyze(bundle, ["compile-metrics"], out, {"compile-metrics": options} if options else None)
    return out / "compile-metrics", session.contexts["compile-metrics"].notes


@pytest.mark.parametrize("name", BUNDLES)
def test_every_bundle_gets_one_row_per_stage(request: pytest.FixtureRequest, name: str, tmp_path: Path) -> None:
    bundle = bundle_path(request, name)
    out, _ = run(bundle, tmp_path)
    assert all((out / file).is_file() for file in OUTPUTS)
    stages = read_csv(out / "stages.csv")
    manifest = manifest_of(bundle)
    assert [row["stage"] for row in stages] == [stage["name"] for stage in manifest["stages"]]
    assert int(stages[0]["ops"]) == len(manifest["operators"])  # the first stage is the tagged input


def test_convnet_stages_lineage_and_partitions(iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    manifest = manifest_of(iree_bundles["manifest"])
    out, notes = run(iree_bundles["manifest"], tmp_path)
    stages = {row["stage"]: row for row in read_csv(out / "stages.csv")}
    assert len(stages) == 13 and list(stages)[0] == "source"  # source + 12 IREE phases
    assert stages["source"]["ops"] == "60" == str(len(manifest["operators"]))
    # Lineage per stage, derived from the per-ID class letters: an erased constant counts apart.
    constants = {op["id"] for op in manifest["operators"] if op["op"] == "arith.constant"}
    classes = manifest["lineage"]["classes"]
    for index, stage in enumerate(manifest["lineage"]["stages"]):
        letters = Counter(letter[index] for letter in classes.values())
        erased_constants = sum(1 for op_id, letter in classes.items() if letter[index] == "e" and op_id in constants)
        row = stages[stage]
        assert (int(row["preserved"]), int(row["fused"]), int(row["split"])) == (letters["p"], letters["f"],
                                                                                 letters["s"]), stage
        assert (int(row["erased"]), int(row["erased_constants"])) == (letters["e"] - erased_constants,
                                                                      erased_constants), stage
    # The convnet's 6 dispatches: exported at executable-targets, called from 6 sites at hal.
    assert (stages["executable-targets"]["partitions"], stages["executable-targets"]["partition_kinds"]) == \
        ("6", "export:6")
    assert (stages["hal"]["partitions"], stages["hal"]["partition_kinds"]) == ("6", "dispatch:6")
    assert stages["vm"]["partitions"] == ""
    # Materialised ops: the long table sums to each stage's total; the top kinds lead.
    materialised = read_csv(out / "materialised.csv")
    for stage, row in stages.items():
        assert sum(int(m["count"]) for m in materialised if m["stage"] == stage) == int(row["materialised"])
    # The top kinds are the stage's most frequent ones, most first; the exact counts depend
    # on the code LLVM generates for this host's CPU (--iree-llvmcpu-target-cpu=host).
    targets = sorted(((int(m["count"]), m["kind"]) for m in materialised if m["stage"] == "executable-targets"),
                     reverse=True)
    top = [entry.split(":") for entry in stages["executable-targets"]["top_materialised"].split(";")]
    assert top[0][0] == "llvm.mlir.constant" and int(top[0][1]) > 50
    assert [int(count) for _, count in top] == [count for count, _ in targets[:len(top)]]
    assert notes == []


def test_convnet_phase_times(iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    compile_info = manifest_of(iree_bundles["full"])["compile"]
    out, _ = run(iree_bundles["full"], tmp_path, top="2")
    phases = read_csv(out / "phases.csv")
    assert [row["phase"] for row in phases] == [*compile_info["phase_s"], "total"]
    assert float(phases[-1]["seconds"]) == compile_info["total_s"]
    assert sum(float(row["seconds"]) for row in phases[:-1]) <= compile_info["total_s"]
    assert {row["source"] for row in phases} == {"manifest"}
    stages = read_csv(out / "stages.csv")
    assert stages[0]["phase_s"] == "" and float(stages[1]["phase_s"]) == compile_info["phase_s"]["input"]
    assert stages[-1]["top_materialised"].count(";") == 1  # top=2 kinds


@pytest.mark.parametrize("name", ("edgetpu", "sambanova", "cerebras"))
def test_reconstructed_bundle_has_one_stage_and_says_so(request: pytest.FixtureRequest, name: str,
                                                        tmp_path: Path) -> None:
    bundle = bundle_path(request, name)
    out, notes = run(bundle, tmp_path)
    stages = read_csv(out / "stages.csv")
    assert [row["stage"] for row in stages] == ["reconstructed"]
    groups = Counter(group["kind"] for group in manifest_of(bundle)["partitions"]["groups"])
    assert stages[0]["partitions"] == str(sum(groups.values()))
    assert any("reconstructed" in note and "no per-phase compile times" in note for note in notes)
    # The vendor's compile timings, where its logs have some, stand in for the phases.
    events = pq.read_table(bundle / "events.parquet").to_pylist()
    timed_compile = [e for e in events if e["kind"] == "compile" and e["duration_ns"] is not None]
    phases = read_csv(out / "phases.csv")
    assert len(phases) == len(timed_compile)
    assert {row["source"] for row in phases} <= {"events"}
    assert (out / "phases.csv").read_text().startswith("phase,level,seconds,share_of_total,source")


def test_edgetpu_partitions_by_kind(edgetpu_bundle: Path, tmp_path: Path) -> None:
    out, _ = run(edgetpu_bundle, tmp_path)
    (row,) = read_csv(out / "stages.csv")
    assert (row["ops"], row["partitions"], row["partition_kinds"]) == ("257", "2", "cpu:1;edgetpu-custom-op:1")
    assert read_csv(out / "phases.csv") == [] and read_csv(out / "materialised.csv") == []


def test_cerebras_compile_phases_come_from_the_log(cerebras_bundle: Path, tmp_path: Path) -> None:
    out, _ = run(cerebras_bundle, tmp_path)
    phases = read_csv(out / "phases.csv")
    first = phases[0]
    assert (first["phase"], first["level"], float(first["seconds"])) == ("Pre-optimization transforms", "0", 5.941)


@pytest.mark.parametrize(("options", "message"), [
    ({"top": "0"}, "top='0' must be a positive integer"),
    ({"top": "many"}, "must be a positive integer"),
    ({"colour": "red"}, "unknown option"),
])
def test_bad_options_are_one_line_errors(iree_bundles: dict[str, Path], tmp_path: Path, options: dict[str, str],
                                         message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        run(iree_bundles["manifest"], tmp_path, **options)
