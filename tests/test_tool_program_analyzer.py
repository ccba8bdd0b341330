"""program-analyzer: arithmetic intensity, achieved MAC/s and boundness per execution
region, on every backend's bundle; the backend profiles and the local-CPU calibration."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from dfit_mlir.errors import InvalidInputError
from dfit_mlir.tools import calibration
from dfit_mlir.tools.profiles import bundled, load_profile
from dfit_mlir.tools.session import analyze
from tests.conftest import bundle_path, read_csv

BUNDLES = ("iree-full", "iree-lite", "iree-ids", "iree-none", "iree-manifest", "edgetpu", "sambanova", "cerebras")
F32 = 4  # bytes per element of the convnet's tensors

# The convnet's shapes (examples/models/convnet.mlir), by hand.
CONV1_MACS = 30 * 30 * 8 * (3 * 3 * 3)  # output pixels x channels, each a 3x3x3 window
CONV1_BYTES = (1 * 32 * 32 * 3 + 3 * 3 * 3 * 8 + 8 + 1 * 30 * 30 * 8) * F32  # input, filter, bias, output (after relu)
FC1_MACS = 1 * 32 * 3136  # (1x3136) . (3136x32)
FC1_BYTES = (1 * 3136 + 3136 * 32 + 32 + 1 * 32) * F32  # input, weight, bias, output (after relu)


@pytest.fixture(autouse=True)
def calibration_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Calibrate into a temporary cache (once for this module), never into ~/.cache."""
    folder = tmp_path_factory.getbasetemp() / "dfit-cache-program-analyzer"
    monkeypatch.setenv(calibration.CACHE_DIR_ENV, str(folder))
    return folder


def run(bundle: Path, out: Path, **options: Any) -> tuple[Path, str]:
    out = out / "analysis"  # a folder of its own: dfit replaces no directory holding the user's files
    _, reports, _ = analyze(bundle, ["program-analyzer"], out, {"program-analyzer": options} if options else None)
    return out / "program-analyzer", reports["program-analyzer"]


def write_profile(path: Path, bandwidth: float, peak: float = 1e9, on_chip: float = 1 << 20) -> Path:
    path.write_text(f"""name: synthetic
backend: synthetic
default_dtype: f32
peak_macs_per_s:
  f32: {{value: {peak!r}, source: test}}
memory_bandwidth_bytes_per_s: {{value: {bandwidth!r}, source: test}}
on_chip_memory_bytes: {{value: {on_chip!r}, source: test}}
""")
    return path


def by_root(rows: list[dict[str, str]]) -> dict[str, dict[str, str]]:
    return {row["root"]: row for row in rows}


def test_matmul_and_conv_regions_checked_by_hand(iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    # Ridge at 1 MAC/byte: the conv region (4.6 MAC/B) is compute-bound, the fc1 region (0.24) memory-bound.
    profile = write_profile(tmp_path / "ridge1.yaml", bandwidth=1e9)
    out, _ = run(iree_bundles["full"], tmp_path / "o", profile=str(profile))
    rows = by_root(read_csv(out / "regions.csv"))
    conv, fc1 = rows["main/linalg.conv_2d_nhwc_hwcf#0"], rows["main/linalg.matmul#0"]
    assert (int(conv["macs"]), int(conv["bytes_moved"]), conv["bytes_rule"]) == (194400, 41984, "boundary tensors")
    assert (int(conv["macs"]), int(conv["bytes_moved"])) == (CONV1_MACS, CONV1_BYTES)
    assert (int(fc1["macs"]), int(fc1["bytes_moved"])) == (FC1_MACS, FC1_BYTES) == (100352, 414208)
    assert float(conv["intensity"]) == pytest.approx(CONV1_MACS / CONV1_BYTES)
    assert float(fc1["intensity"]) == pytest.approx(FC1_MACS / FC1_BYTES)
    assert (conv["boundness"], fc1["boundness"]) == ("compute-bound", "memory-bound")
    assert float(fc1["attainable_macs_per_s"]) == pytest.approx(1e9 * FC1_MACS / FC1_BYTES)
    # Observed time: the site's dispatch events, read straight from the bundle.
    events = pq.read_table(iree_bundles["full"] / "events.parquet").to_pylist()
    for site, row in ((0, conv), (3, fc1)):
        durations = [e["duration_ns"] for e in events if e["kind"] == "dispatch" and e["site"] == site]
        assert (int(row["calls"]), int(row["time_ns"])) == (3, sum(durations))
        achieved = int(row["macs"]) * 3 / (sum(durations) / 1e9)
        assert float(row["achieved_macs_per_s"]) == pytest.approx(achieved)
        assert float(row["efficiency"]) == pytest.approx(achieved / 1e9)
    shares = {row["class"]: row for row in read_csv(out / "boundness.csv")}
    assert {row["share_of"] for row in shares.values()} == {"observed time"}
    assert sum(float(row["share"]) for row in shares.values()) == pytest.approx(1.0)


@pytest.mark.parametrize("bandwidth, expected", [(1.0, "memory-bound"), (1e30, "compute-bound")])
def test_boundness_follows_the_profile(iree_bundles: dict[str, Path], tmp_path: Path, bandwidth: float,
                                       expected: str) -> None:
    out, report = run(iree_bundles["full"], tmp_path, profile=str(write_profile(tmp_path / "p.yaml", bandwidth)))
    rows = read_csv(out / "regions.csv")
    with_macs = [row for row in rows if int(row["macs"]) > 0]
    assert len(with_macs) == 4 and {row["boundness"] for row in with_macs} == {expected}
    # The pooling and softmax dispatches do no MACs: pure data movement is memory-bound on any roof.
    assert {row["boundness"] for row in rows if int(row["macs"]) == 0} == {"memory-bound"}
    shares = {row["class"]: float(row["share"]) for row in read_csv(out / "boundness.csv")}
    if expected == "memory-bound":
        assert shares["memory-bound"] == pytest.approx(1.0) and "memory-bound 100.0%" in report


@pytest.mark.parametrize("name", BUNDLES)
def test_every_bundle_gets_a_roofline(request: pytest.FixtureRequest, name: str, tmp_path: Path) -> None:
    bundle = bundle_path(request, name)
    out, report = run(bundle, tmp_path)
    assert all((out / f).is_file() for f in ("regions.csv", "boundness.csv", "roofline.png", "report.txt"))
    assert (out / "roofline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = read_csv(out / "regions.csv")
    timed = [row for row in rows if row["time_ns"]]
    assert bool(timed) == (name == "iree-full")  # only a full IREE run times its dispatches
    shares = read_csv(out / "boundness.csv")
    assert {row["share_of"] for row in shares} == {"observed time" if timed else "MACs"}
    assert "vendor-published" in report or name.startswith("iree")


def test_reconstructed_regions(edgetpu_bundle: Path, cerebras_bundle: Path, sambanova_bundle: Path,
                               tmp_path: Path) -> None:
    edge = {row["kind"]: row for row in read_csv(run(edgetpu_bundle, tmp_path / "e")[0] / "regions.csv")}
    custom_op = edge["edgetpu-custom-op"]
    assert (custom_op["dtype"], int(custom_op["macs"]), custom_op["time_ns"]) == ("i8", 1092864000, "")
    assert float(custom_op["peak_macs_per_s"]) == 2e12 and custom_op["boundness"] == "memory-bound"
    cerebras = read_csv(run(cerebras_bundle, tmp_path / "c")[0] / "regions.csv")
    query = next(row for row in cerebras if row["region"].endswith("attention.self.query.fc"))
    # 512x128 tokens x 1024 -> 1024 (bf16): the activations in and out plus the 1024x1024 weight.
    assert int(query["macs"]) == 512 * 128 * 1024 * 1024
    assert int(query["bytes_moved"]) == (2 * 512 * 128 * 1024 + 1024 * 1024) * 2
    assert query["boundness"] == "compute-bound"  # 254 MAC/B against a 0.19 MAC/B ridge
    sambanova = read_csv(run(sambanova_bundle, tmp_path / "s")[0] / "regions.csv")
    assert len(sambanova) == 75 and {row["boundness"] for row in sambanova} == {"unknown"}


# --- profiles and calibration --------------------------------------------------------

def test_bundled_profiles_cite_their_figures() -> None:
    assert set(bundled()) == {"iree", "edgetpu", "cerebras", "sambanova"}
    edge = load_profile("edgetpu")
    assert edge is not None and edge.on_chip_memory is not None
    assert edge.on_chip_memory.value == 8 * 1024 * 1024 and edge.peak("i8")[1].value == 4e12 / 2
    for backend in ("edgetpu", "cerebras", "sambanova"):
        profile = load_profile(backend)
        assert profile is not None and not profile.calibrated
        figures = [*profile.peak_macs_per_s.values(), profile.memory_bandwidth, profile.on_chip_memory]
        assert all(figure is not None and figure.source and figure.value > 0 for figure in figures)
        assert "vendor-published" in " ".join(figure.source for figure in figures if figure is not None)
    cerebras = load_profile("cerebras")
    assert cerebras is not None and cerebras.on_chip_memory is not None and cerebras.on_chip_memory.value == 40e9
    assert cerebras.memory_bandwidth.value == 20e15
    assert load_profile("no-such-backend") is None


@pytest.mark.parametrize("text, key", [
    ("name: x\nbackend: x\n", "default_dtype"),
    ("name: x\nbackend: x\ndefault_dtype: f32\npeak_macs_per_s:\n  f32: {value: 1, source: s}\n",
     "memory_bandwidth_bytes_per_s"),
    ("name: x\nbackend: x\ndefault_dtype: f32\npeak_macs_per_s:\n  f32: {value: 1}\n", "peak_macs_per_s.f32.source"),
    ("name: x\nbackend: x\ndefault_dtype: i8\npeak_macs_per_s:\n  f32: {value: 1, source: s}\n", "peak_macs_per_s.i8"),
])
def test_a_profile_missing_a_key_is_refused(iree_bundles: dict[str, Path], tmp_path: Path, text: str,
                                            key: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InvalidInputError, match=re.escape(f"profile {path}: missing key '{key}'")):
        run(iree_bundles["manifest"], tmp_path / "o", profile=str(path))


def test_bad_options_are_refused(iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="program-analyzer: unknown option 'roof'; known: profile"):
        run(iree_bundles["manifest"], tmp_path, roof="x")
    with pytest.raises(InvalidInputError, match="no such file"):
        run(iree_bundles["manifest"], tmp_path, profile=str(tmp_path / "absent.yaml"))


def test_calibration_is_measured_once_and_cached(calibration_cache: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = tmp_path / "fresh.json"
    measured = calibration.calibrate(fresh)
    assert measured.peak_macs_per_s > 1e8 and measured.memory_bandwidth_bytes_per_s > 1e8
    assert "float32 matmul 512x512x512" in measured.compute_method and "copy" in measured.bandwidth_method
    assert json.loads(fresh.read_text())["schema"] == "dfit.calibration"
    with monkeypatch.context() as patched:  # read back, not measured again
        patched.setattr(calibration, "measure", lambda: pytest.fail("measured again instead of read from the cache"))
        assert calibration.calibrate(fresh) == measured
    default = calibration.cache_path()
    assert default.parent == calibration_cache and default.name.startswith("calibration-")
    assert default.name == f"calibration-{re.sub(r'[^A-Za-z0-9._-]', '_', socket.gethostname())}.json"
    cpu = load_profile("iree")
    assert cpu is not None and cpu.calibrated and default.is_file()
    assert cpu.peak(None)[1].value == json.loads(default.read_text())["peak_macs_per_s"]
    # A damaged default cache is measured again; a damaged file the user named is an error.
    default.write_text("{")
    assert load_profile("iree") is not None and json.loads(default.read_text())["version"] == calibration.VERSION
    fresh.write_text("[]")
    with pytest.raises(InvalidInputError, match=re.escape(f"calibration {fresh}: not a dfit.calibration file")):
        load_profile("iree", calibration_path=fresh)


def test_without_a_tensor_graph_or_a_profile(tmp_path: Path) -> None:
    """No tensors: an op's own operand + result bytes stand in (an upper bound); no profile
    for the backend: intensities without a roof, every region 'unknown', no plot."""
    from dfit_mlir.tools.api import ToolContext
    from dfit_mlir.tools.builtin.program_analyzer import ProgramAnalyzer
    from dfit_mlir.tools.model import SemanticModel

    def op(name: str, macs: int | None, size: int) -> dict[str, Any]:
        return {"id": f"m/{name}", "op": f"toy.{name}", "macs": macs, "bytes": size}

    tool = ProgramAnalyzer()
    ctx = ToolContext(tool, tmp_path, {}, "toy", {"backend": "toy"})
    ctx.model = SemanticModel({"capabilities": {"backend": "toy", "exposes": {}}, "tensors": [],
                               "operators": [op("mm", 1000, 300), op("relu", None, 200)],
                               "partitions": {"groups": [{"id": "g", "kind": "partition",
                                                          "operator_ids": ["m/mm", "m/relu"]}]}})
    tool.on_init(ctx)
    tool.on_shutdown(ctx)
    (row,) = read_csv(tmp_path / "regions.csv")
    assert (int(row["macs"]), int(row["bytes_moved"]), row["bytes_rule"]) == (1000, 500, "operator bytes (upper bound)")
    assert float(row["intensity"]) == 2.0 and row["boundness"] == "unknown" and row["peak_macs_per_s"] == ""
    assert not (tmp_path / "roofline.png").exists()
    assert any("no performance profile for the toy backend" in note for note in ctx.notes)
