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

from dfit_mlir.analysis import calibration
from dfit_mlir.analysis.profiles import bundled, load_profile
from dfit_mlir.analysis.tools.session import analyze
from dfit_mlir.core.errors import InvalidInputError
from tests.conftest import bundle_path, read_csv, write_calibration

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
    assert re.search(r"float32 matmul \d+x\d+x\d+, BLAS threads set to \d+", measured.compute_method)
    assert "copy" in measured.bandwidth_method
    assert json.loads(fresh.read_text())["schema"] == "dfit.calibration"
    with monkeypatch.context() as patched:  # read back, not measured again
        patched.setattr(calibration, "measure",
                        lambda threads=1: pytest.fail("measured again instead of read from the cache"))
        assert calibration.calibrate(fresh) == measured
    cores = calibration.available_cores()
    assert measured.threads == cores
    assert f"{cores} thread(s), measured on" in measured.bandwidth_method or (
        f"the {cores}-thread measurement" in measured.bandwidth_method)
    default = calibration.cache_path()
    assert default.parent == calibration_cache and default.name.startswith("calibration-")
    host = re.sub(r'[^A-Za-z0-9._-]', '_', socket.gethostname())
    assert default.name == f"calibration-{host}-{cores}threads.json"
    assert calibration.cache_path(threads=1).name == f"calibration-{host}-1threads.json"
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
    from dfit_mlir.analysis.model import SemanticModel
    from dfit_mlir.analysis.tools.api import ToolContext
    from dfit_mlir.analysis.tools.builtin.program_analyzer import ProgramAnalyzer

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


# --- thread counts, cache roofs, measurement problems ---------------------------------

def test_threads_follow_the_runs_driver() -> None:
    cores = calibration.available_cores()
    assert calibration.threads_of_run({"driver": "local-sync"})[0] == 1
    assert calibration.threads_of_run({"driver": "local-task"}) == (
        cores, f"the run's driver local-task runs workgroups on one worker per core ({cores} available)")
    assert calibration.threads_of_run({})[0] == cores


def test_one_thread_calibration_and_cache_roofs(calibration_cache: Path) -> None:
    single = calibration.calibrate(threads=1)
    assert single.threads == 1 and "BLAS threads set to 1" in single.compute_method
    assert calibration.cache_path(threads=1).is_file()
    profile = load_profile("iree", threads=1)
    assert profile is not None and profile.peak(None)[1].value == single.peak_macs_per_s
    # Linux describes its caches: a roof per level from L2 up, each an upper bound for what fits.
    if Path("/sys/devices/system/cpu/cpu0/cache").is_dir():
        assert [name for name, _, _ in profile.cache_roofs][:1] == ["L2"]
        name, capacity, figure = profile.cache_roofs[-1]
        assert profile.bandwidth_for(capacity)[1].value >= max(figure.value, profile.memory_bandwidth.value)
        assert profile.bandwidth_for(capacity + 1) == ("memory", profile.memory_bandwidth)
    assert profile.bandwidth_for(None) == ("memory", profile.memory_bandwidth)


def test_bad_threads_option(iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="option threads='two' is not a positive whole number"):
        run(iree_bundles["full"], tmp_path, threads="two")


def test_above_the_roof_is_a_measurement_problem(iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    """SYNTHETIC calibration far below this host (1 MAC/s, 1 B/s): every timed region
    with MACs beats its roof, so each is flagged and none is reported as a result."""
    fake = write_calibration(tmp_path / "slow-host.json", 1.0, 1.0, "SYNTHETIC")
    out, report = run(iree_bundles["full"], tmp_path / "o", calibration=str(fake))
    rows = read_csv(out / "regions.csv")
    above = [row for row in rows if row["above_roof"] == "True"]
    assert above and len(above) == sum(1 for row in rows if int(row["macs"]) > 0 and row["time_ns"])
    text = (out / "report.txt").read_text()
    assert f"measurement problem: {len(above)} region(s) ran above the roof" in text
    assert "most efficient region" not in report


def test_calibrated_with_the_runs_threads(iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    out, _ = run(iree_bundles["full"], tmp_path)
    summary = json.loads((iree_bundles["full"] / "summary.json").read_text())
    threads, why = calibration.threads_of_run(summary)
    assert f"calibrated for {threads} thread(s): {why}" in (out / "report.txt").read_text()
    assert calibration.cache_path(threads=threads).is_file()
    assert_within_the_roof(out, iree_bundles["full"])


def assert_within_the_roof(out: Path, bundle: Path) -> None:
    """Each op's MACs counted once (regions sum to the model), and no efficiency above the
    roof reported as a result: a region above it is flagged as a measurement problem and
    never named the most efficient. (Whether a region *runs* above a roof measured on this
    shared machine is timing, so the test checks the rule, not the machine.)"""
    rows = read_csv(out / "regions.csv")
    document = json.loads((bundle / "manifest.json").read_text())
    named = {i for site in document["partitions"]["dispatch_sites"] for i in site["fused_ids"] or site["ids"]}
    total = sum(op["macs"] or 0 for op in document["operators"] if op["id"] in named)
    assert total > 0 and sum(int(row["macs"]) for row in rows) == total
    above = [row["region"] for row in rows if row["above_roof"] == "True"]
    report = (out / "report.txt").read_text()
    assert ("measurement problem" in report) == bool(above)
    best = re.search(r"most efficient region: (\S+) at ([\d.]+)% of peak", report)
    assert best is not None and best[1] not in above and float(best[2]) <= 105.0


@pytest.fixture(scope="module")
def shufflenet_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """onnx's light_shufflenet compiled (full) and run: its padded convs become a
    slow_memcpy dispatch plus the conv dispatch, both naming the conv."""
    from dfit_mlir.passes.instrumented_compile import compile_instrumented
    from dfit_mlir.runtime_hooks.run import run_bundle
    from tests.realmodels import onnx_model

    root = tmp_path_factory.mktemp("shufflenet")
    compiled = compile_instrumented(onnx_model("shufflenet", root), root / "shufflenet.vmfb", mode="full")
    return run_bundle(compiled.vmfb, compiled.manifest_path, root / "run", mode="full", repeat=3, warmup=1).bundle


@pytest.mark.slow
def test_split_ops_count_once_on_a_real_onnx_model(shufflenet_run: Path, tmp_path: Path) -> None:
    document = json.loads((shufflenet_run / "manifest.json").read_text())
    sites = document["partitions"]["dispatch_sites"]
    conv = "shufflenet/onnx.Conv#0"
    naming = [site for site in sites if conv in site["fused_ids"]]
    assert sorted(site["export"].rsplit("_dispatch_", 1)[1].split("_")[1] for site in naming) == ["conv", "slow"]
    out, _ = run(shufflenet_run, tmp_path)
    rows = {row["region"]: row for row in read_csv(out / "regions.csv")}
    conv_macs = next(op["macs"] for op in document["operators"] if op["id"] == conv)
    for site in naming:
        row = rows[f"site{site['index']}:{site['export']}"]
        expected = 0 if "slow_memcpy" in site["export"] else conv_macs
        assert int(row["macs"]) == expected
    assert_within_the_roof(out, shufflenet_run)
    # The model's whole count, and the same per-dispatch figures in the run's events.
    assert sum(int(row["macs"]) for row in rows.values()) == sum(op["macs"] or 0 for op in document["operators"])
    events = pq.read_table(shufflenet_run / "events.parquet", columns=["kind", "site", "macs"]).to_pylist()
    by_site = {e["site"]: e["macs"] or 0 for e in events if e["kind"] == "dispatch"}
    assert sum(by_site.values()) == sum(op["macs"] or 0 for op in document["operators"])


def test_cost_placement_rule() -> None:
    """SYNTHETIC: the rule of dfit_mlir.core.site_costs on IREE's export names."""
    from dfit_mlir.core.site_costs import moves_data_only, placed_costs

    assert moves_data_only("m$async_dispatch_0_slow_memcpy") and moves_data_only("main_dispatch_3_pack_f32")
    assert not moves_data_only("main_dispatch_1_conv_24x112x112x3x3x3_f32") and not moves_data_only(None)
    # A conv in a copy dispatch and its own: all of it in the conv's; a matmul IREE split
    # over two computing dispatches: 7 MACs as 4 + 3; an op only copies name: evenly there.
    placed = placed_costs([["conv"], ["conv", "relu"], ["mm"], ["mm"], ["pad"], ["pad"]],
                          [False, True, True, True, False, False], {"conv": 10, "relu": None, "mm": 7, "pad": 2})
    assert placed == [{}, {"conv": 10}, {"mm": 4}, {"mm": 3}, {"pad": 1}, {"pad": 1}]


def test_threads_of_a_run_say_which_driver_they_come_from() -> None:
    """SYNTHETIC summaries: the two CPU drivers, a GPU driver (named, not "no driver"), none."""
    cores = calibration.available_cores()
    assert calibration.threads_of_run({"driver": "local-sync"})[0] == 1
    assert calibration.threads_of_run({"driver": "local-task"})[0] == cores
    threads, why = calibration.threads_of_run({"driver": "vulkan"})
    assert threads == cores and "vulkan is not a CPU driver" in why
    assert calibration.threads_of_run({})[1].startswith("no run driver recorded")
