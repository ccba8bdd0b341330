"""The manifest's dispatch call sites, checked against the runtime: HAL host-execution
profiling of a straight-line module records one event per dispatch, in the manifest's
program order, on both CPU drivers, and the structural join gives each its own site —
also when one deduplicated export serves many sites. And the instrumented module
computes what the plain one computes. (Programs of other shapes: test_runtime_shapes.py.)"""

from __future__ import annotations

import copy
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from dfit_mlir.core.toolchain import runtime_tool
from dfit_mlir.passes.instrumented_compile import CompileResult, compile_instrumented
from dfit_mlir.passes.plain_compile import plain_compile
from dfit_mlir.runtime_hooks import hal_profile
from tests.conftest import CONVNET, REPO

DEDUP = REPO / "tests" / "inputs" / "repeated_blocks.mlir"
CASES = {
    "convnet": (CONVNET, ["1x32x32x3xf32=0.5"]),
    "repeated-blocks": (DEDUP, ["8x64xf32=1", "64x64xf32=0.01"]),
}


@dataclass(frozen=True)
class Compiled:
    source: Path
    inputs: list[str]
    result: CompileResult


@pytest.fixture(scope="module", params=list(CASES))
def compiled(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Compiled:
    source, inputs = CASES[request.param]
    out = tmp_path_factory.mktemp(request.param) / "model.vmfb"
    return Compiled(source, inputs, compile_instrumented(source, out, mode="ids"))


@pytest.mark.parametrize("driver", hal_profile.DRIVERS)
def test_runtime_order_matches_call_sites(compiled: Compiled, driver: str) -> None:
    result, inputs = compiled.result, compiled.inputs
    sites = result.manifest["partitions"]["dispatch_sites"]
    events = hal_profile.capture(result.vmfb, inputs, driver=driver)
    assert [event.key for event in events] == [site["export"] for site in sites]
    joined = hal_profile.join(events, result.manifest)
    assert [j.root_id for j in joined] == [site["root_id"] for site in sites]
    assert all(j.root_id and j.fused_ids and j.event.duration_ns > 0 for j in joined)
    if driver == "local-task":
        assert [event.command_index for event in events] == [2 * i for i in range(len(events))]
    else:
        assert all(event.command_index is None for event in events)


def test_deduplicated_export_joins_per_site(tmp_path: Path) -> None:
    source, inputs = CASES["repeated-blocks"]
    result = compile_instrumented(source, tmp_path / "dedup.vmfb", mode="ids")
    assert len(result.manifest["partitions"]["exports"]) == 1
    joined = hal_profile.join(hal_profile.capture(result.vmfb, inputs), result.manifest)
    assert len({j.event.key for j in joined}) == 1
    assert [j.root_id for j in joined] == [f"main/linalg.matmul#{k}" for k in range(4)]


def test_a_record_no_site_explains_is_an_error(compiled: Compiled) -> None:
    result = compiled.result
    events = hal_profile.capture(result.vmfb, compiled.inputs)
    wrong = copy.deepcopy(result.manifest)
    for recording in wrong["partitions"]["recordings"]:
        recording["commands"] = [dict(c, export="other_export") if "export" in c else c for c in recording["commands"]]
    with pytest.raises(hal_profile.UnresolvedDispatchError,
                       match=r"\(\d+ dispatch records: \(export \w+, submission \d+, .*\) is explained by no command-buffer recording that main "
                             r"or an initializer executes; candidates: #0 \S+ \[other_export@"):
        hal_profile.join(events, wrong)


def test_instrumented_module_computes_the_same(compiled: Compiled, tmp_path: Path) -> None:
    inputs = compiled.inputs
    plain = tmp_path / "plain.vmfb"
    plain_compile(compiled.source, plain, [])

    def run(vmfb: Path) -> str:
        command = [runtime_tool("iree-run-module"), f"--module={vmfb}", "--device=local-sync",
                   *(f"--input={value}" for value in inputs)]
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout

    output = run(compiled.result.vmfb)
    assert "result[0]" in output
    assert output == run(plain)
