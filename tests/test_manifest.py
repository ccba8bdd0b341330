"""The manifest of the bundled convnet: schema, version gate, operators with hand-checked
costs, tensors, per-stage lineage and the dispatch table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dfit_mlir.core import manifest
from dfit_mlir.core.errors import InvalidInputError
from dfit_mlir.core.toolchain import IREE_PHASES
from dfit_mlir.passes.instrumented_compile import compile_instrumented
from tests.conftest import CONVNET


@pytest.fixture(scope="module")
def convnet_manifest(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("convnet") / "convnet.vmfb"
    result = compile_instrumented(CONVNET, out, mode="full")
    assert out.stat().st_size > 0
    return manifest.load(result.manifest_path)


def op(document: dict, op_id: str) -> dict:
    return next(entry for entry in document["operators"] if entry["id"] == op_id)


def test_costs_checked_by_hand(convnet_manifest: dict) -> None:
    conv1 = op(convnet_manifest, "main/linalg.conv_2d_nhwc_hwcf#0")
    # output 1x30x30x8, each element reads 3x3x3 inputs: 7200 * 27 = 194400 MACs
    assert (conv1["macs"], conv1["flops"]) == (194_400, 388_800)
    # bytes: input 32*32*3*4 + filter 3*3*3*8*4 + init 30*30*8*4 + result 30*30*8*4
    assert conv1["bytes"] == 12_288 + 864 + 28_800 + 28_800
    fc1 = op(convnet_manifest, "main/linalg.matmul#0")
    assert fc1["operands"][1]["shape"] == [3136, 32]
    assert fc1["macs"] == 1 * 32 * 3136
    relu = op(convnet_manifest, "main/linalg.generic#0")
    # 1x30x30x8 elements, addf + maximumf per element
    assert relu["macs"] is None and relu["flops"] == 7200 * 2
    # softmax: 4 FLOPs per element (max, subtract, sum, divide) and its exp, a
    # transcendental (dfit_mlir.core.costs: as XLA counts it, not a FLOP)
    softmax = op(convnet_manifest, "main/linalg.softmax#0")
    assert (softmax["flops"], softmax["transcendentals"]) == (4 * 10, 10)


def test_source_locations_name_paths_and_call_stacks(convnet_manifest: dict) -> None:
    conv1 = op(convnet_manifest, "main/linalg.conv_2d_nhwc_hwcf#0")
    assert conv1["source"] == {"file": "convnet.py", "line": 21, "col": 16}
    assert conv1["name_path"] == ["conv1"]
    assert [frame["line"] for frame in conv1["call_stack"]] == [21, 40]
    assert op(convnet_manifest, "main/linalg.generic#0/arith.maximumf#0")["parent"] == "main/linalg.generic#0"


def test_tensors_link_producers_and_consumers(convnet_manifest: dict) -> None:
    tensors = {t["id"]: t for t in convnet_manifest["tensors"]}
    conv_out = tensors["main/linalg.conv_2d_nhwc_hwcf#0:0"]
    assert conv_out["consumers"] == ["main/linalg.generic#0"]
    assert conv_out["bytes"] == 30 * 30 * 8 * 4 and conv_out["dtype"] == "f32"


def test_every_phase_has_a_stage_row(convnet_manifest: dict) -> None:
    names = [stage["name"] for stage in convnet_manifest["stages"]]
    assert names == ["source", *IREE_PHASES]
    classes = convnet_manifest["lineage"]["classes"]
    assert len(next(iter(classes.values()))) == len(names)
    source = convnet_manifest["stages"][0]
    assert source["coverage"] == 1.0 and source["lineage"]["preserved"] == len(convnet_manifest["operators"])
    # the relu of conv1 is fused into conv1's dispatch: present at dispatch-creation
    assert classes["main/linalg.generic#0"][names.index("dispatch-creation")] in "pf"


def test_dispatch_sites_in_program_order(convnet_manifest: dict) -> None:
    partitions = convnet_manifest["partitions"]
    roots = [site["root_id"] for site in partitions["dispatch_sites"]]
    assert roots == [
        "main/linalg.conv_2d_nhwc_hwcf#0",
        "main/linalg.conv_2d_nhwc_hwcf#1",
        "main/linalg.pooling_nhwc_max#0",
        "main/linalg.matmul#0",
        "main/linalg.matmul#1",
        "main/linalg.softmax#0",
    ]
    first = partitions["dispatch_sites"][0]
    assert first["export"].startswith("main_dispatch_0_conv")
    assert "main/linalg.generic#0" in first["fused_ids"]
    assert partitions["unattributed_sites"] == [] and partitions["unattributed_exports"] == []
    assert {e["name"] for e in partitions["exports"]} == {s["export"] for s in partitions["dispatch_sites"]}


def test_loader_refuses_other_majors_and_bad_documents(tmp_path: Path, convnet_manifest: dict) -> None:
    bad = dict(convnet_manifest, version="3.1")
    (tmp_path / "v3.json").write_text(json.dumps(bad))
    with pytest.raises(InvalidInputError, match="manifest version 3.1 is not supported; this dfit reads 1.x"):
        manifest.load(tmp_path / "v3.json")
    broken = dict(convnet_manifest, operators=[{"id": "x"}])
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    with pytest.raises(InvalidInputError, match="invalid manifest at operators/0"):
        manifest.load(tmp_path / "broken.json")
    newer_minor = dict(convnet_manifest, version="1.7")
    (tmp_path / "minor.json").write_text(json.dumps(newer_minor))
    assert manifest.load(tmp_path / "minor.json")["version"] == "1.7"
