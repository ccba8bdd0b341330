"""Compile-only GPU targets (no device needed): ``dfit compile`` for AMD MI300
(``--iree-hal-target-backends=rocm --iree-rocm-target=gfx942``) and NVIDIA A100
(``--iree-hal-target-device=cuda --iree-cuda-target=sm_80``) keeps lineage through the
ROCDL and NVVM code generators: every dispatch site and export attributed to source IDs,
the manifest names the target, and the executables are byte-identical to a plain
``iree-compile`` of the same flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from dfit_mlir.passes.instrumented_compile import compile_instrumented
from dfit_mlir.passes.plain_compile import plain_compile
from dfit_mlir.runtime_hooks.drivers import vmfb_targets
from tests.test_gpu_vulkan import MLP, TWO_ENTRIES

TARGETS = {
    "rocm-gfx942": (["--iree-hal-target-backends=rocm", "--iree-rocm-target=gfx942"], "hip"),
    "cuda-sm_80": (["--iree-hal-target-device=cuda", "--iree-cuda-target=sm_80"], "cuda"),
}


@pytest.mark.parametrize("program", ["mlp", "two"])
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_gpu_target_keeps_lineage(target: str, program: str, tmp_path: Path) -> None:
    flags, device = TARGETS[target]
    source = tmp_path / f"{program}.mlir"
    source.write_text(MLP if program == "mlp" else TWO_ENTRIES)
    dump = [f"--iree-hal-dump-executable-binaries-to={tmp_path / 'tagged'}"]
    result = compile_instrumented(source, tmp_path / "tagged.vmfb", mode="full", flags=[*flags, *dump])
    partitions = result.manifest["partitions"]
    sites, exports = partitions["dispatch_sites"], partitions["exports"]
    assert sites and all(site["root_id"] and site["ids"] for site in sites)
    assert exports and all(export["root_id"] and export["ids"] for export in exports)
    assert not partitions["unattributed_sites"] and not partitions["unattributed_exports"]
    assert result.manifest["compile"]["flags"][:len(flags)] == flags
    assert vmfb_targets(result.vmfb) == (device,)
    plain_compile(source, tmp_path / "plain.vmfb", [*flags, f"--iree-hal-dump-executable-binaries-to={tmp_path / 'plain'}"])
    tagged, plain = (sorted((tmp_path / kind).iterdir()) for kind in ("tagged", "plain"))
    assert tagged and [f.name for f in tagged] == [f.name for f in plain]
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(tagged, plain, strict=True))
