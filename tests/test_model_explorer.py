"""Model Explorer node data from an IREE bundle (the convnet, and a TFLite model compiled
by IREE) and from reconstructed Edge TPU bundles.

Node keys are checked against what Model Explorer's TFLite adapter matches node data by,
the output tensor names of the model's ops, read here with the ``tflite`` flatbuffer
reader. Where ``ai-edge-model-explorer`` is installed, its own ``node_data_builder`` and
adapter check the files too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from dfit_mlir.analysis.model import SemanticModel
from dfit_mlir.core.errors import InvalidInputError
from dfit_mlir.views import model_explorer
from tests import realmodels
from tests.conftest import vendor_fixture

FRANCO = "edgetpu/franco_fc_v15"
YOLO_TFLITE = "edgetpu/goalbuddy_yolov8_v16/yolov8n_full_integer_quant.tflite"
RESULT_FIELDS = {"value", "bgColor", "textColor"}
DOCUMENT_FIELDS = {"name", "results", "gradient", "thresholds"}


def output_tensor_names(tflite_path: Path) -> set[str]:
    import tflite

    model = tflite.Model.GetRootAsModel(tflite_path.read_bytes(), 0)
    names = set()
    for g in range(model.SubgraphsLength()):
        graph = model.Subgraphs(g)
        for i in range(graph.OperatorsLength()):
            op = graph.Operators(i)
            names.update(graph.Tensors(op.Outputs(j)).Name().decode() for j in range(op.OutputsLength()))
    return names


def check_structure(document: dict[str, Any], numeric: bool) -> None:
    """The GraphNodeData shape Model Explorer loads, checked without the package."""
    assert set(document) <= DOCUMENT_FIELDS and isinstance(document["name"], str)
    for key, result in document["results"].items():
        assert isinstance(key, str) and set(result) <= RESULT_FIELDS and "value" in result
        assert isinstance(result["value"], (int, float) if numeric else str)
    if numeric:
        assert [item["stop"] for item in document["gradient"]] == [0, 1]


def dispatch_events(bundle: Path) -> list[dict[str, Any]]:
    return [e for e in pq.read_table(bundle / "events.parquet").to_pylist() if e["kind"] == "dispatch"]


@pytest.fixture(scope="module")
def franco_edgetpu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dfit_mlir.adapters.reconstruct import reconstruct_bundle

    out = tmp_path_factory.mktemp("franco-edgetpu") / "bundle"
    reconstruct_bundle([vendor_fixture(FRANCO)], out)
    return out


@pytest.fixture(scope="module")
def franco_iree_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """franco_fc's .tflite compiled by IREE and run (batch 1)."""
    from dfit_mlir.passes.instrumented_compile import compile_instrumented
    from dfit_mlir.runtime_hooks.run import run_bundle

    root = tmp_path_factory.mktemp("franco-iree")
    try:
        source = realmodels.tflite_model(vendor_fixture(FRANCO) / "model.tflite", root)
    except realmodels.FixtureUnavailable as reason:
        pytest.skip(str(reason))
    compiled = compile_instrumented(source, root / "franco.vmfb", mode="ids")
    return run_bundle(compiled.vmfb, compiled.manifest_path, root / "run", mode="full", repeat=2,
                      inputs=["1x28x28xi8=1"]).bundle


# --- values ---------------------------------------------------------------------------------

def test_edgetpu_ops_keyed_by_output_tensor_name(franco_edgetpu: Path) -> None:
    macs = model_explorer.node_data(SemanticModel.open(franco_edgetpu), "macs")
    # FULLY_CONNECTED 784→128 and 128→10 at batch 1; RESHAPE has no MACs.
    assert macs["results"] == {"tfl.fully_connected": {"value": 784 * 128},
                               "StatefulPartitionedCall:0_int8": {"value": 128 * 10}}
    sizes = model_explorer.node_data(SemanticModel.open(franco_edgetpu), "bytes")["results"]
    # The last layer's bytes crossing its partition's boundary (the ledger's bytes): weights
    # 10x128 i8, bias 10 i32 and output 1x10 i8; its 1x128 i8 input comes from the first
    # layer inside the same Edge TPU partition. The compiled model's custom op has the same
    # output tensor name and is left out.
    assert sizes["StatefulPartitionedCall:0_int8"] == {"value": 10 * 128 + 10 * 4 + 10}
    assert set(sizes) == output_tensor_names(vendor_fixture(FRANCO) / "model.tflite")


def test_iree_ops_keyed_by_location_name(iree_bundles: dict[str, Path]) -> None:
    macs = model_explorer.node_data(SemanticModel.open(iree_bundles["full"]), "macs")["results"]
    assert macs == {"conv1": {"value": 30 * 30 * 8 * 3 * 3 * 3}, "conv2": {"value": 28 * 28 * 16 * 3 * 3 * 8},
                    "fc1": {"value": 3136 * 32}, "fc2": {"value": 32 * 10}}


def test_iree_time_is_each_dispatch_split_by_the_ledger(iree_bundles: dict[str, Path]) -> None:
    model = SemanticModel.open(iree_bundles["full"])
    events = dispatch_events(iree_bundles["full"])
    invocations = len({e["invocation"] for e in events})
    by_id = model_explorer.node_data(model, "time", key="id")["results"]
    assert sum(r["value"] for r in by_id.values()) == pytest.approx(sum(e["duration_ns"] for e in events) / invocations,
                                                                   abs=1.0)  # each value rounded to 0.1 ns
    by_name = model_explorer.node_data(model, "time")["results"]
    conv1 = [e["duration_ns"] for e in events if e["site"] == 0]
    # Dispatch 0 does conv1, its zero fill and relu1, split by the ledger's roofline
    # (weights worked out in test_tool_attribution): the fill reads nothing from outside.
    conv_weight, relu_weight = max(194_400, 4.0 * (13_152 + 28_800)), max(14_400, 4.0 * 32)
    share = conv_weight / (conv_weight + relu_weight)
    # The ledger splits a dispatch's time in whole ns (its parts sum to the dispatch): 1 ns
    # at most per op, over the invocations.
    assert by_name["conv1"]["value"] == pytest.approx(sum(conv1) / invocations * share, abs=1 / invocations + 0.1)
    assert by_name["relu1"]["value"] == pytest.approx(sum(conv1) / invocations * (1 - share),
                                                      abs=1 / invocations + 0.1)
    assert "main/linalg.fill#2" not in by_name  # no share: no value


def test_iree_time_lands_on_the_tflite_graph(franco_iree_run: Path) -> None:
    time = model_explorer.node_data(SemanticModel.open(franco_iree_run), "time")
    events = dispatch_events(franco_iree_run)
    # IREE keeps the TFLite tensor names in its locations: each fully-connected layer's
    # dispatch time lands on that layer's node of the original model.
    assert set(time["results"]) == {"tfl.fully_connected", "StatefulPartitionedCall:0_int8"}
    assert set(time["results"]) <= output_tensor_names(vendor_fixture(FRANCO) / "model.tflite")
    assert sum(r["value"] for r in time["results"].values()) == pytest.approx(
        sum(e["duration_ns"] for e in events) / 2, abs=0.2)
    check_structure(time, numeric=True)


def test_executed_flops_per_invocation_beside_time(iree_bundles: dict[str, Path]) -> None:
    """``executed_flops``: the ledger's executed FLOPs per invocation, beside time per
    invocation, titled with where they come from; ``flops`` is titled per trip. The
    convnet has no loop: executed per invocation = per trip on every node, from the run's
    events (= executed over the run ÷ 3 invocations) and from the manifest's trip counts
    alone."""
    from dfit_mlir.analysis import ledger

    model = SemanticModel.open(iree_bundles["full"])
    book = ledger.of(model)
    executed = model_explorer.node_data(model, "executed_flops", key="id")
    assert executed["name"] == "dfit executed flops (per invocation, from run events)"
    assert model_explorer.node_data(model, "flops")["name"] == "dfit flops (per trip)"
    check_structure(executed, numeric=True)
    figures = book.op_figures()
    assert executed["results"] and {k: r["value"] for k, r in executed["results"].items()} == {
        op_id: book.per_invocation(f["executed_flops"]) for op_id, f in figures.items() if f["executed_flops"]}
    flops = model_explorer.node_data(model, "flops")["results"]
    assert model_explorer.node_data(model, "executed_flops")["results"] == flops
    static = model_explorer.node_data(SemanticModel.open(iree_bundles["manifest"]), "executed_flops")
    assert static["name"] == "dfit executed flops (per invocation, from manifest trips)" and static["results"] == flops


@pytest.fixture(scope="module")
def loop_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """tests/inputs/shapes/loop.mlir (a matmul in an scf.for of ``%n`` trips, an input)
    compiled and run with n = 7, 2 invocations."""
    from dfit_mlir.passes.instrumented_compile import compile_instrumented
    from dfit_mlir.runtime_hooks.run import run_bundle

    root = tmp_path_factory.mktemp("loop")
    compiled = compile_instrumented(Path(__file__).parent / "inputs" / "shapes" / "loop.mlir", root / "loop.vmfb",
                                    mode="ids")
    bundle = run_bundle(compiled.vmfb, compiled.manifest_path, root / "run", mode="full",
                        inputs=("16x16xf32=0.01", "i32=7"), repeat=2).bundle
    return {"manifest": compiled.manifest_path, "bundle": bundle}


def test_executed_flops_count_every_trip_of_a_loop(loop_run: dict[str, Path]) -> None:
    """The loop's matmul: 2 x 16^3 FLOPs per trip, 7 trips an invocation counted by the
    run; its manifest alone has no static trip count, so no node gets an executed value
    (never the per-trip figure passed off as executed)."""
    matmul = "main/scf.for#0/linalg.matmul#0"
    ran = model_explorer.node_data(SemanticModel.open(loop_run["bundle"]), "executed_flops", key="id")["results"]
    per_trip = model_explorer.node_data(SemanticModel.open(loop_run["bundle"]), "flops", key="id")["results"]
    assert per_trip[matmul] == {"value": 2 * 16 ** 3} and ran[matmul] == {"value": 7 * 2 * 16 ** 3}
    static = model_explorer.node_data(SemanticModel.open(loop_run["manifest"]), "executed_flops", key="id")
    assert static["results"] == {} and static["name"] == "dfit executed flops (per invocation)"


def test_partitions_as_text_with_one_colour_each(edgetpu_bundle: Path) -> None:
    document = model_explorer.node_data(SemanticModel.open(edgetpu_bundle), "partition")
    check_structure(document, numeric=False)
    values = [r["value"] for r in document["results"].values()]
    # yolov8n: 233 ops in the custom op, 23 on the CPU (the custom op itself left out).
    assert sorted((v.rsplit("/", 1)[-1], values.count(v)) for v in set(values)) == [("cpu", 23), ("edgetpu#0", 233)]
    assert len({r["bgColor"] for r in document["results"].values()}) == 2
    assert set(document["results"]) <= output_tensor_names(vendor_fixture(YOLO_TFLITE))


# --- files ----------------------------------------------------------------------------------

def test_one_file_per_metric(franco_edgetpu: Path, tmp_path: Path) -> None:
    single = model_explorer.export(franco_edgetpu, tmp_path / "one.json", metrics="macs")
    assert [(e.metric, e.path.name, e.nodes) for e in single] == [("macs", "one.json", 2)]
    several = model_explorer.export(franco_edgetpu, tmp_path / "nd.json", metrics="macs,bytes,time")
    assert [(e.metric, e.path.name, e.nodes) for e in several] == [
        ("macs", "nd.macs.json", 2), ("bytes", "nd.bytes.json", 3), ("time", "nd.time.json", 0)]  # no timing
    for exported in (*single, *several):
        check_structure(json.loads(exported.path.read_text()), numeric=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nd.bytes.json", "nd.macs.json", "nd.time.json", "one.json"]


@pytest.mark.parametrize(("metrics", "key", "message"), [
    ("macs,latency", "name", "unknown metric latency"),
    ("", "name", "unknown metric (none given)"),
    ("macs", "index", "unknown node key 'index'"),
])
def test_bad_options_are_one_line_errors(franco_edgetpu: Path, tmp_path: Path, metrics: str, key: str,
                                         message: str) -> None:
    with pytest.raises(InvalidInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        model_explorer.export(franco_edgetpu, tmp_path / "x.json", metrics=metrics, key=key)
    assert list(tmp_path.iterdir()) == []


# --- against Model Explorer itself, where installed --------------------------------------------

def test_model_explorer_builds_the_same_node_data(franco_edgetpu: Path) -> None:
    builder = pytest.importorskip("model_explorer.node_data_builder",
                                  reason="ai-edge-model-explorer is not installed (an optional viewer)")
    for metric in ("macs", "partition"):
        ours = model_explorer.node_data(SemanticModel.open(franco_edgetpu), metric)
        theirs = builder.GraphNodeData(
            name=ours["name"], results={k: builder.NodeDataResult(**v) for k, v in ours["results"].items()},
            gradient=[builder.GradientItem(**item) for item in ours.get("gradient", [])])
        rebuilt = json.loads(theirs.to_json_string())
        assert {field: rebuilt[field] for field in ours} == ours


def test_model_explorer_tflite_adapter_finds_every_key(franco_edgetpu: Path) -> None:
    adapter = pytest.importorskip("ai_edge_model_explorer_adapter",
                                  reason="ai-edge-model-explorer is not installed (an optional viewer)")
    graphs = json.loads(adapter.ConvertFlatbufferDirectlyToJson(adapter.VisualizeConfig(),
                                                                str(vendor_fixture(FRANCO) / "model.tflite")))
    tensor_names = {attr["value"] for collection in graphs for graph in collection["subgraphs"]
                    for node in graph["nodes"] for output in node.get("outputsMetadata", [])
                    for attr in output.get("attrs", []) if attr["key"] == "tensor_name"}
    keys = model_explorer.node_data(SemanticModel.open(franco_edgetpu), "bytes")["results"]
    assert set(keys) <= tensor_names
