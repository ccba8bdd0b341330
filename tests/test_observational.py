"""The instrumented compile is observational: `dfit compile --dfit-tag --mode ids`
generates the same executables as a plain `iree-compile` of the same input.

What is compared: the exported dispatch names (rodata strings), the executable binaries
byte for byte (sha256 of each external rodata segment), and the VM function table. What
differs, by design: the vmfb's VM debug source map keeps the dfit locations, so the
FlatBuffer grows by the length of the ID strings; nothing the device executes changes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dfit_mlir.core.vmfb import read_module
from dfit_mlir.passes.instrumented_compile import compile_instrumented
from dfit_mlir.passes.plain_compile import plain_compile
from tests.conftest import CONVNET, REPO

DEDUP = REPO / "tests" / "inputs" / "repeated_blocks.mlir"


@pytest.mark.parametrize("source", [CONVNET, DEDUP], ids=["convnet", "repeated-blocks"])
def test_ids_mode_generates_the_same_executables(source: Path, tmp_path: Path) -> None:
    plain_compile(source, tmp_path / "plain.vmfb", [])
    result = compile_instrumented(source, tmp_path / "ids.vmfb", mode="ids")
    plain = read_module(tmp_path / "plain.vmfb")
    instrumented = read_module(result.vmfb)

    assert instrumented.executables == plain.executables and plain.executables
    assert instrumented.executable_sizes == plain.executable_sizes
    assert instrumented.embedded_strings == plain.embedded_strings
    assert instrumented.function_bytecode == plain.function_bytecode
    exports = [e["name"] for e in result.manifest["partitions"]["exports"]]
    assert all(any(name.startswith(s.rstrip(".")[:30]) for name in exports)
               for s in plain.embedded_strings if "_dispatch_" in s)
    # Only the VM debug info (the source map with dfit locations) may add bytes.
    growth = result.vmfb.stat().st_size - (tmp_path / "plain.vmfb").stat().st_size
    assert 0 <= growth < 0.1 * (tmp_path / "plain.vmfb").stat().st_size


def test_deduplicated_export_serves_every_site(tmp_path: Path) -> None:
    """Four identical dense+relu blocks: IREE keeps one export; the manifest lists four
    call sites in program order, each with its own root ID."""
    result = compile_instrumented(DEDUP, tmp_path / "dedup.vmfb", mode="ids")
    partitions = result.manifest["partitions"]
    sites = partitions["dispatch_sites"]
    assert len(partitions["exports"]) < len(sites)
    roots = [site["root_id"] for site in sites]
    assert len(set(roots)) == len(roots) == 4
    assert len({site["export"] for site in sites}) == 1
    assert all(site["fused_ids"] and site["root_id"] in site["fused_ids"] for site in sites)
