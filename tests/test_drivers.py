"""The two phase drivers (in-process C API phase setters, and the public
`iree-compile --compile-from/--compile-to` fallback) produce the same manifest, and
inputs in other dialects than linalg compile with IDs and costs."""

from __future__ import annotations

from pathlib import Path

import pytest

from dfit_mlir.core.errors import ToolchainError
from dfit_mlir.passes import phases
from dfit_mlir.passes.instrumented_compile import compile_instrumented
from tests.conftest import CONVNET, REPO

STABLEHLO = REPO / "tests" / "inputs" / "stablehlo_small.mlir"


def _comparable(manifest: dict) -> dict:
    return {
        "operators": [(op["id"], op["hash"], op["macs"]) for op in manifest["operators"]],
        "stages": [(s["name"], s["ops"], s["non_constant_tagged"], s["lineage"]) for s in manifest["stages"]],
        "sites": manifest["partitions"]["dispatch_sites"],
        "exports": manifest["partitions"]["exports"],
        "classes": manifest["lineage"]["classes"],
        "stage_ir": {key: value for key, value in manifest["stage_ir"].items() if key != "time_s"},
    }


def test_subprocess_driver_matches_in_process(tmp_path: Path) -> None:
    in_process = compile_instrumented(CONVNET, tmp_path / "a.vmfb", mode="full", driver_name="in-process")
    fallback = compile_instrumented(CONVNET, tmp_path / "b.vmfb", mode="full", driver_name="subprocess")
    assert in_process.manifest["compile"]["driver"] == "in-process"
    assert fallback.manifest["compile"]["driver"] == "subprocess"
    assert _comparable(fallback.manifest) == _comparable(in_process.manifest)


def test_phase_setter_gate_names_the_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(phases.toolchain, "installed_version", lambda package: "3.99.0")
    with pytest.raises(ToolchainError, match=r"needs iree-base-compiler==3\.13\.0 \(found 3\.99\.0\)"):
        phases.require_phase_setters()
    driver = phases.open_driver([])  # falls back, with a note on stderr
    try:
        assert driver.name == "subprocess"
    finally:
        driver.close()


def test_stablehlo_input(tmp_path: Path) -> None:
    result = compile_instrumented(STABLEHLO, tmp_path / "shlo.vmfb", mode="ids")
    operators = {op["id"]: op for op in result.manifest["operators"]}
    dot = operators["main/stablehlo.dot_general#0"]
    assert dot["macs"] == 2 * 8 * 4 * 16  # batch 2, 8x4 output, contraction 16
    assert dot["name_path"] == ["jit(fwd)/dense/dot_general"]
    conv = operators["main/stablehlo.convolution#0"]
    assert conv["macs"] == 6 * 6 * 5 * 27  # 1x6x6x5 outputs, 3x3x3 window
    sites = result.manifest["partitions"]["dispatch_sites"]
    assert sites and all(site["ids"] for site in sites)
    roots = {site["root_id"] for site in sites}
    assert {"main/stablehlo.dot_general#0", "main/stablehlo.convolution#0"} <= roots
