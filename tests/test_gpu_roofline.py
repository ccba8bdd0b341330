"""The roofline of a GPU run: the profile of the run's device, chosen by the name its
driver reports (``summary.json`` → ``device``): vendor-published dense peaks for named
parts (H100, H200, A100, MI300X: f32/f16/bf16/i8 and HBM bandwidth, each with its
source), lavapipe as the host CPU calibrated, and no roof (with a note naming the
device) for a GPU dfit has no figures for. No device needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from dfit_mlir.analysis import ledger, profiles
from dfit_mlir.analysis.model import SemanticModel

#: Device names as the CUDA / HIP / Vulkan drivers report them → the bundled profile.
NAMES = [
    ("cuda", "NVIDIA H200", "nvidia-h200"),
    ("cuda", "NVIDIA H100 80GB HBM3", "nvidia-h100-sxm"),
    ("vulkan", "NVIDIA H100 PCIe", "nvidia-h100-pcie"),
    ("cuda", "NVIDIA A100-SXM4-80GB", "nvidia-a100-80gb"),
    ("cuda", "NVIDIA A100-PCIE-40GB", "nvidia-a100-40gb"),
    ("hip", "AMD Instinct MI300X", "amd-mi300x"),
    ("vulkan", "llvmpipe (LLVM 15.0.6, 256 bits)", "lavapipe"),
    ("vulkan", "AMD Radeon RX 7900 XTX (RADV NAVI31)", None),
    ("hip", "NVIDIA H200", None),  # a part on a driver that cannot drive it
    ("cuda", "NVIDIA A100 80GB PCIe", None),  # no figures bundled for this board
]


@pytest.mark.parametrize(("driver", "name", "expected"), NAMES)
def test_device_name_selects_its_profile(driver: str, name: str, expected: str | None) -> None:
    path = profiles.profile_path_for_device(driver, name)
    assert (path.stem if path else None) == expected


@pytest.mark.parametrize("path", [p for _, _, p in profiles.device_profiles() if p.stem != "lavapipe"],
                         ids=lambda p: p.stem)
def test_vendor_parts_publish_every_figure_with_its_source(path: Path) -> None:
    profile = profiles.read_profile(path)
    assert set(profile.peak_macs_per_s) == {"f32", "f16", "bf16", "i8"}
    assert all(len(figure.source) > 30 for figure in profile.peak_macs_per_s.values())
    assert profile.memory_bandwidth.value > 1e12 and "bandwidth" in profile.memory_bandwidth.source
    # Tensor/matrix units: the 16-bit peak is at least 8x the f32 one, int8 twice 16-bit.
    peak = {dtype: figure.value for dtype, figure in profile.peak_macs_per_s.items()}
    assert peak["f16"] == peak["bf16"] >= 8 * peak["f32"] and peak["i8"] == pytest.approx(2 * peak["f16"], rel=1e-3)
    assert not profile.calibrated


def test_named_parts_are_not_backend_defaults() -> None:
    """A run without a device (a CPU run, a manifest) keeps the local CPU's profile."""
    assert profiles.bundled()["iree"].name == "iree-local-cpu.yaml"
    assert {p.stem for _, _, p in profiles.device_profiles()} >= {"nvidia-h200", "amd-mi300x", "lavapipe"}
    assert profiles.load_profile("iree", device={"driver": "local-task", "name": ""}, threads=1).name == "local CPU"


def _model(device: dict[str, str] | None) -> SemanticModel:
    manifest = {"input": {}, "operators": [], "partitions": {"dispatch_sites": []}, "lineage": {}}
    model = SemanticModel(manifest)
    model.__dict__["summary"] = {"device": device} if device else {}  # the run's summary.json
    return model


def test_load_profile_and_time_model_follow_the_device() -> None:
    h200 = {"driver": "cuda", "name": "NVIDIA H200"}
    profile = profiles.load_profile("iree", device=h200)
    assert profile is not None and profile.name == "NVIDIA H200 SXM"
    assert profile.peak("bf16")[1].value == 4.9475e14 and profile.memory_bandwidth.value == 4.8e12
    model = ledger.time_model_for(_model(h200))
    assert model.ridge_macs_per_byte == pytest.approx(3.35e13 / 4.8e12) and "nvidia-h200.yaml" in model.source
    unknown = {"driver": "vulkan", "name": "AMD Radeon RX 7900 XTX"}
    assert profiles.load_profile("iree", device=unknown) is None
    assert profiles.missing("iree", unknown).startswith("dfit has no peaks for the vulkan device 'AMD Radeon RX 7900")
    # lavapipe: the host CPU, calibrated (an upper bound for its shaders).
    lavapipe = profiles.load_profile("iree", device={"driver": "vulkan", "name": "llvmpipe (LLVM 15.0.6)"}, threads=1)
    assert lavapipe is not None and lavapipe.calibrated and lavapipe.name.startswith("lavapipe")
    assert ledger.time_model_for(_model({"driver": "vulkan", "name": "llvmpipe"})).ridge_macs_per_byte == \
        ledger.DEFAULT_CPU_RIDGE
