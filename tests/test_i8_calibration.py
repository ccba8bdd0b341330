"""The local CPU's int8 roof, measured (issue 28).

The calibrated local-CPU profile measured one peak, a float32 matmul, so an int8
dispatch (``..._i8xi8xi32``) was held against the f32 peak. The calibration now also
times an ``i8 x i8 -> i32`` matmul that IREE compiles for this CPU (what runs an int8
dispatch: numpy and PyTorch have no fast int8 CPU matmul), caches it with the other
figures, and program-analyzer holds int8 regions against it: an int8 QDQ CNN (built and
quantized here with ``onnxruntime.quantization``), compiled, run and analyzed with the
bundled profile, reports its i8 dispatches' efficiency as achieved / the measured i8
peak."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dfit_mlir.analysis import calibration
from dfit_mlir.analysis.profiles import load_profile
from dfit_mlir.analysis.tools.session import analyze
from tests.conftest import read_csv, write_calibration

pytest.importorskip("onnxruntime.quantization", reason="onnxruntime is not installed (pip install -e .[test])")


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(calibration.CACHE_DIR_ENV, str(folder))
    return folder


def test_calibration_measures_and_caches_an_int8_peak(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    measured = calibration.calibrate(threads=1)
    assert measured.peak_i8_macs_per_s is not None and measured.peak_i8_macs_per_s > 1e8
    assert "i8 x i8 -> i32 matmul" in measured.i8_compute_method and "compiled for the host CPU" \
        in measured.i8_compute_method
    # Cached with the other figures, and read back, not measured again.
    stored = json.loads(calibration.cache_path(threads=1).read_text())
    assert stored["version"] == calibration.VERSION == 3
    assert stored["peak_i8_macs_per_s"] == measured.peak_i8_macs_per_s
    monkeypatch.setattr(calibration, "measure", lambda threads=1: pytest.fail("measured again"))
    profile = load_profile("iree", threads=1)
    assert profile is not None and profile.calibrated
    assert set(profile.peak_macs_per_s) == {"f32", "i8"}
    assert profile.peak_macs_per_s["i8"].value == measured.peak_i8_macs_per_s
    assert profile.peak("i8")[0] == "i8" and profile.peak("f32")[0] == "f32"


@pytest.mark.slow
def test_int8_dispatch_efficiency_is_against_the_int8_peak(cache: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from dfit_mlir.cli.app import main
    from dfit_mlir.runtime_hooks.run import run_bundle
    from tests.test_int8_dtypes import _quantized

    source = _quantized(tmp_path, "qdq")
    compiled = CliRunner().invoke(main, ["compile", str(source), "--dfit-tag", "--mode", "ids",
                                         "-o", str(tmp_path / "qdq.vmfb")])
    assert compiled.exit_code == 0, compiled.output
    # local-sync: the dispatches run on one thread, so the roof is the 1-thread calibration.
    bundle = run_bundle(tmp_path / "qdq.vmfb", tmp_path / "qdq.manifest.json", tmp_path / "run", mode="full",
                        repeat=5, warmup=1, driver="local-sync").bundle
    analyze(bundle, ["program-analyzer"], tmp_path / "analysis", {})
    figures = calibration.calibrate(threads=1)  # what the analysis measured and cached
    assert figures.peak_i8_macs_per_s is not None
    rows = read_csv(tmp_path / "analysis" / "program-analyzer" / "regions.csv")
    int8 = [row for row in rows if row["region"].endswith("_i8xi8xi32")]
    assert len(int8) == 3  # conv1, conv2, the Gemm
    for row in int8:
        assert (row["dtype"], row["peak_dtype"]) == ("i8", "i8")
        assert float(row["peak_macs_per_s"]) == pytest.approx(figures.peak_i8_macs_per_s)
        achieved = float(row["achieved_macs_per_s"])
        assert achieved > 0
        assert float(row["efficiency"]) == pytest.approx(achieved / figures.peak_i8_macs_per_s)
        # Not the f32 peak's efficiency (the two peaks differ by far more than noise).
        assert not math.isclose(float(row["efficiency"]), achieved / figures.peak_macs_per_s, rel_tol=0.05)
    f32 = [row for row in rows if row["dtype"] == "f32" and row["peak_macs_per_s"]]
    assert f32 and all(float(row["peak_macs_per_s"]) == pytest.approx(figures.peak_macs_per_s) for row in f32)
    # The view draws the i8 roof beside the f32 one and holds each i8 dispatch under it.
    from dfit_mlir.analysis.model import SemanticModel
    from dfit_mlir.views import html

    data = html.view_data(SemanticModel.open(bundle))
    roof, columns = data["roof"], data["roofline"]
    assert roof["dtype"] == "f32" and roof["peaks"]["i8"] == pytest.approx(2 * figures.peak_i8_macs_per_s)
    names = [data["strings"][n] if isinstance(n, int) else n for n in data["dispatches"]["name"]]
    by_name = {name: d for d, name in enumerate(names)}
    for row in int8:
        d = by_name[row["region"]]
        assert columns["peak_dtype"][d] == "i8"
        # The dispatch's roof: the i8 compute peak or the bandwidth slope, never the f32 peak.
        assert columns["roof"][d] <= 2 * figures.peak_i8_macs_per_s * 1.000001


def test_a_calibration_file_without_int8_figures_still_loads(tmp_path: Path) -> None:
    """A calibration written by hand (or by a tool that knows no int8 peak) is read as it
    is: the profile has its f32 peak only, and int8 regions fall back to it."""
    path = write_calibration(tmp_path / "by-hand.json", 2.0e10, 1.0e10, "by hand")
    profile = load_profile("iree", calibration_path=path)
    assert profile is not None and set(profile.peak_macs_per_s) == {"f32"}
    assert profile.peak("i8") == ("f32", profile.peak_macs_per_s["f32"])
