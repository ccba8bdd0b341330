"""ONNX and TFLite: module paths from node and tensor names.

* ONNX exported from PyTorch (a transformers ConvNext through ``torch.onnx.export``, the
  TorchScript exporter: no download, no onnxscript) names nodes after module paths,
  ``/encoder/stages.0/layers.0/dwconv/Conv``; the ``onnx`` wheel's squeezenet has flat
  names (``n58``).
* TFLite: the real quantized MobileNet v1 from ``../shared/fixtures/edgetpu``, converted
  with ``tosa-converter-for-tflite``: tensor names ``MobilenetV1/MobilenetV1/Conv2d_0/Relu6``
  in locations on ``model.tflite:0``, which is no source line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dfit_mlir.analysis.tools.session import analyze
from dfit_mlir.frontends.onnx import module_of
from dfit_mlir.passes.instrumented_compile import compile_instrumented
from tests import frontend_models, realmodels
from tests.conftest import read_csv

pytestmark = [pytest.mark.slow]


def _compile(source: Path, root: Path) -> tuple[dict[str, Any], Path]:
    compiled = compile_instrumented(source, root / (source.stem + ".vmfb"), mode="ids",
                                    flags=realmodels.IREE_CPU_FLAGS)
    analyze(compiled.manifest_path, ["semantic-attribution"], root / "analysis")
    return compiled.manifest, root / "analysis" / "semantic-attribution"


@pytest.fixture(scope="module")
def onnx_convnext(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, Any]:
    import warnings

    import torch

    root = tmp_path_factory.mktemp("onnx-convnext")
    model, args = frontend_models.convnext()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notes
        torch.onnx.export(model, args, str(root / "convnext.onnx"), dynamo=False, opset_version=17)
    graph = realmodels.prepare_onnx(root / "convnext.onnx").graph
    manifest, out = _compile(realmodels.import_onnx(root / "convnext.onnx", root / "convnext.mlir"), root)
    return manifest, out, graph


@pytest.fixture(scope="module")
def tflite_mobilenet(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    root = tmp_path_factory.mktemp("tflite")
    try:
        source = realmodels.tflite_model(realmodels.TFLITE_MODELS["mobilenet_v1_0.25_128"], root)
    except realmodels.FixtureUnavailable as reason:
        pytest.skip(str(reason))
    return _compile(source, root)


@pytest.mark.parametrize(("name", "module"), [
    ("/model.22/cv3.0/cv3.0.0/conv/Conv", "/model.22/cv3.0/cv3.0.0/conv"),
    ("/encoder/stages.0/layers.0/dwconv/Conv", "/encoder/stages.0/layers.0/dwconv"),
    ("/Softmax", ""),
    ("conv1", "conv1"),
    ("gpu_0/res2_0_branch2a_1", "gpu_0"),
])
def test_onnx_module_of_node_name(name: str, module: str) -> None:
    assert module_of(name) == module


@pytest.mark.frontends
def test_onnx_module_path_is_the_node_name_prefix(onnx_convnext: tuple[dict[str, Any], Path, Any]) -> None:
    manifest, out, graph = onnx_convnext
    assert manifest["input"]["frontend"] == "onnx"
    node_types = {node.name: node.op_type for node in graph.node}
    checked = set()
    for op in manifest["operators"]:
        if op["op"].startswith("onnx.") and op["name_path"] and op["name_path"][-1] in node_types:
            name = op["name_path"][-1]
            assert op["module_path"] == name.rpartition("/")[0] if "/" in name else name
            assert op["source_op"] == f"onnx.{node_types[name]}" and op["phase"] == "forward"
            checked.add(name)
    # Every node but the Constant ones (imported as literals) is an onnx.* op, checked.
    assert checked >= {n.name for n in graph.node if n.op_type != "Constant"}
    conv = next(op for op in manifest["operators"] if op["name_path"][-1:] == ["/encoder/stages.0/layers.0/dwconv/Conv"])
    assert conv["module_path"] == "/encoder/stages.0/layers.0/dwconv"
    # The `/` hierarchy rolls up like PyTorch's module tree.
    rows = {row["module_path"]: row for row in read_csv(out / "modules.csv")}
    assert rows["/encoder/stages.0/layers.0/dwconv"]["parent"] == "/encoder/stages.0/layers.0"
    assert rows["/encoder/stages.0/layers.0"]["parent"] == "/encoder/stages.0"
    assert rows["/encoder"]["parent"] == ""
    assert int(rows["/encoder"]["flops"]) == sum(int(r["flops"]) for r in rows.values()
                                                  if r["parent"] == "/encoder") + int(rows["/encoder"]["self_flops"])
    sites = read_csv(out / "sites.csv")
    assert {row["site_kind"] for row in sites} == {"module"} and "graph:main_graph" not in {r["site"] for r in sites}
    assert len(sites) > 10


@pytest.mark.parametrize("model", ["squeezenet"])
def test_onnx_wheel_model_flat_names(model: str, tmp_path: Path) -> None:
    """Flat node names (``n58``): every node is its own layer; the graph is the root."""
    manifest, out = _compile(realmodels.onnx_model(model, tmp_path), tmp_path)
    names = realmodels.onnx_source_names(model)
    computing = [op for op in manifest["operators"] if op["op"] in ("onnx.Conv", "onnx.Relu", "onnx.Concat")]
    assert computing and all(op["module_path"] == op["name_path"][-1] and op["module_path"] in names
                             for op in computing)
    graph_op = next(op for op in manifest["operators"] if op["op"] == "func.func")
    assert (graph_op["module_path"], graph_op["module_class"]) == ("", "squeezenet_old")
    assert json.loads((out / "summary.json").read_text())["non_constant_with_phase_pct"] == 100.0


def test_tflite_module_path_is_the_tensor_name_prefix(tflite_mobilenet: tuple[dict[str, Any], Path]) -> None:
    manifest, out = tflite_mobilenet
    assert manifest["input"]["frontend"] == "tflite"
    named = [op for op in manifest["operators"] if "/" in (op["name_path"] or [""])[-1]]
    assert len(named) > 200
    for op in named:
        assert op["module_path"] == op["name_path"][-1].split(";")[0].rpartition("/")[0]
        assert op["source_op"] == op["op"] and op["phase"] == "forward"
    convs = {op["module_path"] for op in manifest["operators"] if op["op"] == "tosa.conv2d"}
    assert "MobilenetV1/MobilenetV1/Conv2d_0" in convs
    sites = read_csv(out / "sites.csv")
    # `model.tflite:0` is no source line: the ops are ranked by their layers.
    assert not [row for row in sites if ".tflite:" in row["site"]]
    assert {row["site_kind"] for row in sites} == {"module"}
    assert len({row["site"] for row in sites}) > 20
    rows = {row["module_path"]: row for row in read_csv(out / "modules.csv")}
    assert rows["MobilenetV1/MobilenetV1/Conv2d_0"]["parent"] == "MobilenetV1/MobilenetV1"
    assert rows["MobilenetV1"]["parent"] == ""
