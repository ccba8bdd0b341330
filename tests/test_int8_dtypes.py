"""int8 counted as int8 (issue 28): an ONNX CNN built here with the ``onnx`` helpers,
quantized by ``onnxruntime.quantization.quantize_static`` — QDQ (``DequantizeLinear →
Conv → QuantizeLinear``, the float types on every source op) and QOperator
(``QLinearConv`` on ``ui8``) — compiled through ``dfit compile`` and read by
program-analyzer: the region says the type the dispatch computes in, the roofline takes
that type's peak, and a QDQ dispatch moves its own signature's bytes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dfit_mlir.analysis import calibration
from dfit_mlir.analysis.tools.session import analyze
from tests.conftest import read_csv

pytest.importorskip("onnxruntime.quantization", reason="onnxruntime is not installed (pip install -e .[test])")

I8_PEAK, F32_PEAK = 4e11, 1e11


def _float_cnn(path: Path, *, gemm: bool) -> None:
    """Conv(3→8) + ReLU, Conv(8→16, stride 2) + ReLU[, flatten, Gemm(1024→10)] on 1x3x16x16."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def weight(name: str, *shape: int) -> Any:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)

    weights = [weight("c1w", 8, 3, 3, 3), weight("c1b", 8), weight("c2w", 16, 8, 3, 3), weight("c2b", 16)]
    nodes = [helper.make_node("Conv", ["x", "c1w", "c1b"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "c2w", "c2b"], ["c2"], name="conv2", pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c2"], ["r2" if gemm else "y"], name="relu2")]
    out = [1, 10] if gemm else [1, 16, 8, 8]
    if gemm:
        weights += [weight("fcw", 16 * 8 * 8, 10), weight("fcb", 10),
                    numpy_helper.from_array(np.array([1, -1], np.int64), "shape")]
        nodes += [helper.make_node("Reshape", ["r2", "shape"], ["flat"], name="flatten"),
                  helper.make_node("Gemm", ["flat", "fcw", "fcb"], ["y"], name="fc")]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)


def _quantized(root: Path, fmt: str) -> Path:
    import numpy as np
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    source, target = root / f"cnn_{fmt}_f32.onnx", root / f"cnn_{fmt}.onnx"
    _float_cnn(source, gemm=fmt == "qdq")  # com.microsoft's QGemm has no IREE import: QOperator is convs only
    rng = np.random.default_rng(1)

    class Batches(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(4)])

        def get_next(self) -> dict[str, Any] | None:
            return next(self.batches, None)

    kind = QuantType.QInt8 if fmt == "qdq" else QuantType.QUInt8
    quantize_static(str(source), str(target), Batches(), quant_format=QuantFormat.QDQ if fmt == "qdq" else
                    QuantFormat.QOperator, activation_type=kind, weight_type=kind)
    return target


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each quantized model through the front door: ``dfit compile model.onnx --dfit-tag``."""
    from click.testing import CliRunner

    from dfit_mlir.cli.app import main

    root = tmp_path_factory.mktemp("int8")
    found = {}
    for fmt in ("qdq", "qop"):
        source = _quantized(root, fmt)
        result = CliRunner().invoke(main, ["compile", str(source), "--dfit-tag", "-o", str(root / f"{fmt}.vmfb")])
        assert result.exit_code == 0, result.output
        found[fmt] = root / f"{fmt}.manifest.json"
    return found


@pytest.fixture(autouse=True)
def _no_calibration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(calibration.CACHE_DIR_ENV, str(tmp_path / "cache"))


def _profile(path: Path) -> Path:
    """A CPU profile publishing an i8 peak 4x its f32 one (figures of no device: the test
    checks which one a region is held against)."""
    path.write_text(f"""name: int8-test
backend: iree
default_dtype: f32
peak_macs_per_s:
  f32: {{value: {F32_PEAK!r}, source: test}}
  i8: {{value: {I8_PEAK!r}, source: test}}
memory_bandwidth_bytes_per_s: {{value: 1.0e+10, source: test}}
on_chip_memory_bytes: {{value: 1048576, source: test}}
""")
    return path


def _regions(manifest: Path, out: Path) -> dict[str, dict[str, str]]:
    folder = out / "analysis"
    analyze(manifest, ["program-analyzer"], folder, {"program-analyzer": {"profile": str(_profile(out / "p.yaml"))}})
    return {row["region"]: row for row in read_csv(folder / "program-analyzer" / "regions.csv")}


def test_qdq_dispatches_are_int8_with_their_signature_bytes(compiled: dict[str, Path], tmp_path: Path) -> None:
    from dfit_mlir.analysis import ledger
    from dfit_mlir.analysis.model import SemanticModel

    document = json.loads(compiled["qdq"].read_text())
    sites = document["partitions"]["dispatch_sites"]
    int8 = [site for site in sites if site["export"].endswith("_i8xi8xi32")]
    assert len(int8) == 3  # conv1, conv2, the Gemm (a matvec)
    # The source ops carry the QDQ graph's float types; the regions computed in i8.
    ops = {op["id"]: op for op in document["operators"]}
    assert all(ops[site["root_id"]]["operands"][0]["dtype"] == "f32" for site in int8)
    assert all(site["dtype"] == "i8" for site in int8)
    rows = _regions(compiled["qdq"], tmp_path)
    model = SemanticModel.open(compiled["qdq"])
    book = ledger.of(model)
    for site in int8:
        row = rows[f"site{site['index']}:{site['export']}"]
        assert (row["dtype"], row["peak_dtype"], float(row["peak_macs_per_s"])) == ("i8", "i8", I8_PEAK)
        signature = site["bytes_read"] + site["bytes_written"]
        assert (int(row["bytes_moved"]), row["bytes_rule"]) == (signature, "dispatch signature")
        entries = [e for e in book.entries.to_pylist() if e["site"] == site["index"]]
        assert sum(e["bytes_read"] for e in entries) == site["bytes_read"]
        assert sum(e["bytes_written"] for e in entries) == site["bytes_written"]
    # The Gemm's f32 graph moved 3.3x its i8 signature (its f32 weights); the signature is i8-sized:
    # 1024x10 weights + 1024 inputs at a byte each, a few scales and a 10-element i32 bias.
    gemm = next(site for site in int8 if "matvec" in site["export"])
    assert 1024 * 10 + 1024 <= site_bytes(gemm) < 1024 * 10 * 4
    # A dispatch computing in f32 (the input's QuantizeLinear) keeps the graph's bytes and type.
    first = next(site for site in sites if site["export"].endswith("_f32xi8"))
    assert rows[f"site{first['index']}:{first['export']}"]["dtype"] == "f32"
    assert rows[f"site{first['index']}:{first['export']}"]["bytes_rule"] == "boundary tensors"


def site_bytes(site: dict[str, Any]) -> int:
    return int(site["bytes_read"]) + int(site["bytes_written"])


def test_qlinearconv_keeps_ui8_under_a_profile_without_it(compiled: dict[str, Path], tmp_path: Path) -> None:
    """The profile has no ui8 peak: the region still says ui8 (the fallback no longer
    overwrites it) and is held against the signless i8 peak."""
    document = json.loads(compiled["qop"].read_text())
    convs = [site for site in document["partitions"]["dispatch_sites"] if "_conv_" in site["export"]]
    assert len(convs) == 2
    rows = _regions(compiled["qop"], tmp_path)
    for site in convs:
        row = rows[f"site{site['index']}:{site['export']}"]
        assert (row["dtype"], row["peak_dtype"], float(row["peak_macs_per_s"])) == ("ui8", "i8", I8_PEAK)


def test_show_counts_ids_fused_into_dispatches(compiled: dict[str, Path]) -> None:
    """``dfit show``'s fused column (issue 28): the QDQ model's convs lower to several
    linalg ops each (lineage letter ``s``), fused with their Dequantize/Quantize ops into
    one dispatch: fused from dispatch-creation on, where the lineage letters alone say 0."""
    from click.testing import CliRunner

    from dfit_mlir.cli.app import main
    from dfit_mlir.passes.compile_report import dispatch_fused

    document = json.loads(compiled["qdq"].read_text())
    stages = document["lineage"]["stages"]
    at = stages.index("dispatch-creation")
    assert next(s for s in document["stages"] if s["name"] == "dispatch-creation")["lineage"]["fused"] == 0
    fused = dispatch_fused(document)
    letters = {op_id: document["lineage"]["classes"][op_id][at] for op_id in fused}
    assert "cnn/onnx.Conv#0" in fused and letters["cnn/onnx.Conv#0"] == "s"  # split, and fused
    result = CliRunner().invoke(main, ["show", str(compiled["qdq"])])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split() for line in result.output.splitlines()[2:] if line.split()}
    header = result.output.splitlines()[1].split()
    column = header.index("fused")
    assert int(rows["dispatch-creation"][column]) == len(fused) == 13
    assert int(rows["global-optimization"][column]) == 0  # before dispatches: the letters' count
    pres, split = header.index("pres"), header.index("split")
    for name in ("dispatch-creation", "flow"):
        row, counts = rows[name], next(s for s in document["stages"] if s["name"] == name)["lineage"]
        assert int(row[pres]) + int(row[column]) + int(row[split]) == \
            counts["preserved"] + counts["fused"] + counts["split"]  # moved between columns, none lost
