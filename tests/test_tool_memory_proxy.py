"""memory-proxy: the liveness walk (checked by hand on a tiny graph and against the raw
TFLite files of real Edge TPU models), weights apart, the compiler's parameter figures,
and the fits / does-not-fit verdict against the on-chip memory, on every backend."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dfit_mlir.analysis import calibration
from dfit_mlir.analysis.model import SemanticModel
from dfit_mlir.analysis.tools.api import ToolContext
from dfit_mlir.analysis.tools.builtin.memory_proxy import MemoryProxy
from dfit_mlir.analysis.tools.session import analyze
from dfit_mlir.core.errors import InvalidInputError
from tests.conftest import bundle_path, vendor_fixture

BUNDLES = ("iree-full", "iree-lite", "iree-ids", "iree-none", "iree-manifest", "edgetpu", "sambanova", "cerebras")
EDGE_TPU_SRAM = 8 * 1024 * 1024
KIB, MIB = 1024, 1024 * 1024


@pytest.fixture(autouse=True)
def calibration_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The IREE profile calibrates this host: into a temporary cache, never ~/.cache."""
    monkeypatch.setenv(calibration.CACHE_DIR_ENV, str(tmp_path_factory.getbasetemp() / "dfit-cache-memory-proxy"))


def run(bundle: Path, out: Path, **options: Any) -> tuple[Path, dict[str, Any], str]:
    out = out / "analysis"  # a folder of its own: dfit replaces no directory holding the user's files
    _, reports, _ = analyze(bundle, ["memory-proxy"], out, {"memory-proxy": options} if options else None)
    folder = out / "memory-proxy"
    return folder, json.loads((folder / "memory.json").read_text()), reports["memory-proxy"]


def models_of(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {model["model"]: model for model in document["models"]}


def reconstructed(tmp_path_factory: pytest.TempPathFactory, name: str, *relative: str) -> Path:
    from dfit_mlir.adapters.reconstruct import reconstruct_bundle

    out = tmp_path_factory.mktemp(name) / "bundle"
    reconstruct_bundle([vendor_fixture(r) for r in relative], out)
    return out


@pytest.fixture(scope="module")
def cocompiled_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Google's two co-compiled MobileNet v1 models with their original .tflite files."""
    return reconstructed(tmp_path_factory, "cocompiled", "edgetpu/coral_test_data/cocompilation",
                         "edgetpu/coral_test_data/mobilenet_v1_0.25_128_quant.tflite",
                         "edgetpu/coral_test_data/mobilenet_v1_0.5_160_quant.tflite")


# --- the walk, by hand -------------------------------------------------------------------

def tiny_model() -> SemanticModel:
    """a -> op1 -> b -> op2(w) -> c -> op3(c, a) -> d: ``a`` skips to op3, ``w`` is a weight."""
    def op(name: str) -> dict[str, Any]:
        return {"id": f"m/{name}", "op": f"toy.{name}"}

    def tensor(name: str, producer: str | None, consumers: list[str], size: int, **extra: Any) -> dict[str, Any]:
        return {"id": f"m/{name}", "producer": producer and f"m/{producer}", "consumers": [f"m/{c}" for c in consumers],
                "shape": [size], "dtype": "i8", "bytes": size, **extra}

    return SemanticModel({
        "capabilities": {"backend": "toy", "exposes": {"tensor_shapes": "full"}},
        "operators": [op("op1"), op("op2"), op("op3")],
        "tensors": [tensor("a", None, ["op1", "op3"], 100), tensor("w", None, ["op2"], 1000, constant=True),
                    tensor("b", "op1", ["op2"], 200), tensor("c", "op2", ["op3"], 400),
                    tensor("d", "op3", [], 50)],
        "partitions": {"groups": []},
    })


def write_profile(path: Path, on_chip: int) -> Path:
    path.write_text("name: toy\nbackend: toy\ndefault_dtype: i8\npeak_macs_per_s:\n  i8: {value: 1.0, source: test}\n"
                    f"memory_bandwidth_bytes_per_s: {{value: 1.0, source: test}}\n"
                    f"on_chip_memory_bytes: {{value: {on_chip}, source: test}}\n")
    return path


@pytest.mark.parametrize("on_chip, fits, margin", [(2048, True, 2048 - 1700), (1000, False, 1000 - 1700)])
def test_liveness_peak_of_a_tiny_graph(tmp_path: Path, on_chip: int, fits: bool, margin: int) -> None:
    tool = MemoryProxy()
    ctx = ToolContext(tool, tmp_path / "out", {}, "toy", {"backend": "toy"},
                      {"profile": str(write_profile(tmp_path / "toy.yaml", on_chip))})
    ctx.model = tiny_model()
    tool.on_init(ctx)
    tool.on_shutdown(ctx)
    with (tmp_path / "out" / "liveness.csv").open() as handle:
        steps = [(row["op"], int(row["live_bytes"])) for row in csv.DictReader(handle)]
    # op1: a + b; op2: a (held for op3) + b + c; op3: a + c + d. The weight w is apart.
    assert steps == [("m/op1", 100 + 200), ("m/op2", 100 + 200 + 400), ("m/op3", 100 + 400 + 50)]
    (model,) = json.loads((tmp_path / "out" / "memory.json").read_text())["models"]
    assert (model["model"], model["peak_activation_bytes"], model["peak_op"]) == ("m", 700, "m/op2")
    assert (model["weight_bytes"], model["parameters_bytes"], model["parameters_source"]) == \
        (1000, 1000, "manifest weights")
    assert (model["total_bytes"], model["fits"], model["margin_bytes"]) == (1700, fits, margin)
    assert tool.report(ctx).splitlines() == [
        f"on-chip budget {on_chip / 1024 / 1024:.2f} MiB (toy)",
        f"m: {'fits' if fits else 'does not fit'}: parameters + peak activations = {1700 / 1024 / 1024:.2f} MiB of "
        f"{on_chip / 1024 / 1024:.2f} MiB, {abs(margin) / 1024 / 1024:.2f} MiB {'spare' if fits else 'over'}"]


def test_bad_options_are_refused(iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="memory-proxy: unknown option 'budget'; known: profile"):
        run(iree_bundles["manifest"], tmp_path, budget="1")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nbackend: x\ndefault_dtype: i8\npeak_macs_per_s:\n  i8: {value: 1, source: s}\n"
                   "memory_bandwidth_bytes_per_s: {value: 1, source: s}\n")
    with pytest.raises(InvalidInputError, match="bad.yaml: missing key 'on_chip_memory_bytes'"):
        run(iree_bundles["manifest"], tmp_path, profile=str(bad))


# --- real Edge TPU models: expected values from the raw .tflite files ---------------------

TFLITE_ELEMENT_BYTES = {0: 4, 1: 2, 2: 4, 3: 1, 4: 8, 7: 2, 9: 1, 10: 8, 16: 2}  # FLOAT32, FLOAT16, INT32, UINT8, ...


def tflite_liveness(path: Path) -> tuple[int, int, int]:
    """(peak live activation bytes, index of the op at the peak, weight bytes), read from
    the flatbuffer with the ``tflite`` package, independently of dfit's reconstruction."""
    import tflite

    model = tflite.Model.GetRootAsModel(path.read_bytes(), 0)
    graph = model.Subgraphs(0)

    def size(index: int) -> int:
        tensor = graph.Tensors(index)
        return int(np.prod(tensor.ShapeAsNumpy())) * TFLITE_ELEMENT_BYTES[tensor.Type()]

    weights = {i for i in range(graph.TensorsLength()) if model.Buffers(graph.Tensors(i).Buffer()).DataLength()}
    count = graph.OperatorsLength()
    born: dict[int, int] = {}
    dies: dict[int, int] = {}
    for step in range(count):
        op = graph.Operators(step)
        for index in op.InputsAsNumpy():
            if index >= 0 and index not in weights:
                born.setdefault(index, 0)
                dies[index] = step
        for index in op.OutputsAsNumpy():
            born[index], dies[index] = step, count - 1
    for index in graph.OutputsAsNumpy():
        dies[index] = count - 1
    live = [sum(size(t) for t in born if born[t] <= step <= dies[t]) for step in range(count)]
    return max(live), int(np.argmax(live)), sum(size(i) for i in weights)


@pytest.mark.parametrize("relative, model", [
    ("edgetpu/goalbuddy_yolov8_v16", "yolov8n_full_integer_quant"),
    ("edgetpu/coral_transfer_mobilenet_v2_v16", "mobilenet_v2_1.0_224_quant"),
])
def test_edgetpu_models_against_their_tflite(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path,
                                             relative: str, model: str) -> None:
    bundle = reconstructed(tmp_path_factory, model, relative)
    peak, at, weights = tflite_liveness(vendor_fixture(f"{relative}/{model}.tflite"))
    folder, document, report = run(bundle, tmp_path)
    found = models_of(document)[model]
    assert (found["peak_activation_bytes"], found["weight_bytes"]) == (peak, weights)
    with (folder / "liveness.csv").open() as handle:
        liveness = list(csv.DictReader(handle))
    assert liveness[at]["op"] == found["peak_op"] and int(liveness[at]["live_bytes"]) == peak
    # No compiler summary in these fixtures: the parameters are the manifest's weights.
    assert found["parameters_source"] == "manifest weights" and document["budget"]["bytes"] == EDGE_TPU_SRAM
    assert found["fits"] is True and found["margin_bytes"] == EDGE_TPU_SRAM - weights - peak
    assert f"{model}: fits" in report


def test_yolov8n_peak_is_the_first_silu(edgetpu_bundle: Path, tmp_path: Path) -> None:
    """x, sigmoid(x) and x*sigmoid(x) of the first conv (1x160x160x16 int8) live together."""
    _, document, _ = run(edgetpu_bundle, tmp_path)
    found = models_of(document)["yolov8n_full_integer_quant"]
    assert found["peak_activation_bytes"] == 3 * 160 * 160 * 16
    assert found["peak_op"] == "yolov8n_full_integer_quant/subgraph0/MUL#0"
    assert found["weight_bytes"] == 3182053 and found["total_bytes"] == 3182053 + 3 * 160 * 160 * 16


def test_cocompiled_mobilenets_by_hand(cocompiled_bundle: Path, tmp_path: Path) -> None:
    """MobileNet v1 is a chain: the peak is the largest input + output of one op, here the
    first pointwise conv (64x64x8 -> 64x64x16 at alpha 0.25, 80x80x16 -> 80x80x32 at 0.5)."""
    _, document, report = run(cocompiled_bundle, tmp_path)
    found = models_of(document)
    small, large = found["mobilenet_v1_0.25_128_quant"], found["mobilenet_v1_0.5_160_quant"]
    assert small["peak_activation_bytes"] == 64 * 64 * 8 + 64 * 64 * 16 == 98304
    assert large["peak_activation_bytes"] == 80 * 80 * 16 + 80 * 80 * 32 == 307200
    assert small["peak_op"].endswith("/CONV_2D#1") and large["peak_op"].endswith("/CONV_2D#1")
    for name, model in found.items():
        _, _, weights = tflite_liveness(vendor_fixture(f"edgetpu/coral_test_data/{name}.tflite"))
        assert model["weight_bytes"] == weights and model["fits"] is True
    combined = document["combined"]
    assert combined["parameters_bytes"] == small["weight_bytes"] + large["weight_bytes"]
    assert combined["total_bytes"] == combined["parameters_bytes"] + 307200 and combined["fits"] is True
    assert "all models co-resident: fits" in report


def test_compiler_parameter_figures_of_a_cocompile(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    """DeepPiCar's co-compile log: 322.25KiB and 4.21MiB cached on chip, nothing streamed;
    no .tflite was published, so the activations stay unknown."""
    bundle = reconstructed(tmp_path_factory, "deeppicar", "edgetpu/deeppicar_cocompile_stdout_v16")
    _, document, report = run(bundle, tmp_path)
    found = models_of(document)
    lane, detector = found["lane_navigation_w_pretrain_final"], found["efficientdet-lite"]
    assert lane["compiler_parameter_bytes"] == {"on_chip_parameter_bytes": round(322.25 * KIB),
                                                "off_chip_parameter_bytes": 0}
    assert detector["parameters_bytes"] == round(4.21 * MIB) and detector["parameters_source"] == "compiler summary"
    assert lane["peak_activation_bytes"] is None and detector["peak_activation_bytes"] is None
    assert lane["fits"] is detector["fits"] is True
    assert "parameters alone (activations unknown)" in detector["verdict"]
    combined = document["combined"]
    assert combined["parameters_bytes"] == round(322.25 * KIB) + round(4.21 * MIB)
    assert combined["margin_bytes"] == EDGE_TPU_SRAM - combined["parameters_bytes"]
    assert "efficientdet-lite: fits" in report


# --- every backend ----------------------------------------------------------------------

@pytest.mark.parametrize("name", BUNDLES)
def test_every_bundle(request: pytest.FixtureRequest, name: str, tmp_path: Path) -> None:
    out, document, report = run(bundle_path(request, name), tmp_path)
    assert all((out / f).is_file() for f in ("liveness.csv", "memory.json", "report.txt"))
    models = models_of(document)
    if name.startswith("iree"):
        main = models["main"]
        # The convnet's weights: fc1 3136x32, conv2 3x3x8x16, fc2 32x10, conv1 3x3x3x8 and the biases (f32).
        assert main["weight_bytes"] == (3136 * 32 + 3 * 3 * 8 * 16 + 32 * 10 + 3 * 3 * 3 * 8 + 16 + 32 + 8) * 4
        assert main["peak_activation_bytes"] > 0 and main["fits"] is True  # half a MiB in any CPU's last-level cache
    elif name == "sambanova":
        assert models == {} and "no models" in report  # the logs give shapes without byte sizes
    elif name == "cerebras":
        assert document["budget"]["bytes"] == 40e9 and all(m["fits"] for m in models.values())
