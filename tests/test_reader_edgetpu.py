"""Edge TPU reconstruction readers against the real artifacts in ../shared/fixtures/edgetpu.

Every expected value below was read from the fixture files themselves (the operation
log tables, the console summary, the TFLite graphs) or computed here by hand from shapes
and published architectures; none is copied from the readers' output. Inputs written by
the tests themselves are labelled synthetic and only exercise error paths and the
cross-check with the operation log.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dfit_mlir.adapters.base import ASPECTS
from dfit_mlir.adapters.edgetpu import (
    READERS,
    ConsoleSummaryReader,
    OperationLogReader,
    TFLiteModelReader,
    capabilities,
    reconstruct,
)
from dfit_mlir.adapters.recovery import ArtifactError, Coverage, Recovery, read_head
from tests.conftest import VENDOR_FIXTURES, vendor_fixture

MAPPED = "Mapped to Edge TPU"
SUBGRAPHS = "More than one subgraph is not supported"
UNSPECIFIED = "Operation is otherwise supported, but not mapped due to some unspecified limitation"
UNSUPPORTED_TYPE = "Operation is working on an unsupported data type"

YOLO = "edgetpu/goalbuddy_yolov8_v16/yolov8n_full_integer_quant"
MOBILENET_V2 = "edgetpu/coral_transfer_mobilenet_v2_v16/mobilenet_v2_1.0_224_quant"
FRANCO = "edgetpu/franco_fc_v15/model"
PIPELINE = "edgetpu/coral_test_data/pipeline/ssd_mobilenet_v2_coco_quant_postprocess"


def fixture_files(pattern: str) -> list[str]:
    """Fixture paths (relative to the shared fixtures) matching ``pattern``; one
    placeholder when ../shared is absent, so the test shows up as skipped with a reason."""
    root = VENDOR_FIXTURES / "edgetpu"
    if not root.is_dir():
        return [f"edgetpu/{pattern} (../shared absent)"]
    return sorted(str(path.relative_to(VENDOR_FIXTURES)) for path in root.rglob(pattern) if path.is_file())


def op_types(recovery: Recovery) -> Counter[str]:
    return Counter(op.op.removeprefix("tflite.") for op in recovery.operators)


def mobilenet_v1_macs(alpha: float, resolution: int) -> int:
    """MACs of MobileNet v1 from its published layer table (Howard et al. 2017, Table 1):
    a 3x3/2 conv, 13 depthwise-separable blocks, a 1001-way 1x1 classifier."""
    blocks = [
        (1, 64),
        (2, 128),
        (1, 128),
        (2, 256),
        (1, 256),
        (2, 512),
        *[(1, 512)] * 5,
        (2, 1024),
        (1, 1024),
    ]
    size, channels = resolution // 2, int(32 * alpha)
    macs = size * size * channels * 3 * 3 * 3
    for stride, width in blocks:
        size //= stride
        macs += size * size * channels * 3 * 3  # depthwise 3x3
        macs += size * size * int(width * alpha) * channels  # pointwise 1x1
        channels = int(width * alpha)
    return macs + 1001 * channels


# ---------------------------------------------------------------------------- TFLite models


@dataclass(frozen=True)
class ModelCase:
    fixture: str
    op_counts: dict[str, int]
    tensors: int
    compiled: bool
    #: IDs of the first ops, in file order.
    first_ids: tuple[str, ...] = ()
    #: Graph input / output tensor names.
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    #: op ID -> MACs computed by hand from the shapes.
    macs: dict[str, int] = field(default_factory=dict)
    #: Sum of MACs over all ops, from the published architecture.
    total_macs: int | None = None
    constant_tensors: int | None = None
    #: Sizes of the edgetpu-custom-op payload (compiled Edge TPU executable + parameters).
    executable_bytes: int | None = None
    #: Ops of a compiled model left to the CPU (their IDs, where listed).
    cpu_op_count: int = 0
    cpu_ops: tuple[str, ...] = ()


MODEL_CASES = [
    ModelCase(
        f"{FRANCO}.tflite",
        {"RESHAPE": 1, "FULLY_CONNECTED": 2},
        tensors=9,
        compiled=False,
        first_ids=("subgraph0/RESHAPE#0", "subgraph0/FULLY_CONNECTED#0", "subgraph0/FULLY_CONNECTED#1"),
        inputs=("serving_default_flatten_input:0_int8",),
        outputs=("StatefulPartitionedCall:0_int8",),
        # Flatten 1x28x28 -> 784, Dense 784->128, Dense 128->10 (weights [128,784], [10,128]).
        macs={"subgraph0/FULLY_CONNECTED#0": 28 * 28 * 128, "subgraph0/FULLY_CONNECTED#1": 128 * 10},
        constant_tensors=5,  # the reshape target shape, 2 weight matrices, 2 biases
    ),
    ModelCase(
        f"{FRANCO}_edgetpu.tflite",
        {"edgetpu-custom-op": 1},
        tensors=2,
        compiled=True,
        first_ids=("subgraph0/edgetpu-custom-op#0",),
        inputs=("serving_default_flatten_input:0_int8",),
        outputs=("StatefulPartitionedCall:0_int8",),
        executable_bytes=143418,
    ),
    ModelCase(
        f"{MOBILENET_V2}.tflite",
        {
            "QUANTIZE": 2,
            "CONV_2D": 36,
            "DEPTHWISE_CONV_2D": 17,
            "PAD": 4,
            "ADD": 10,
            "MEAN": 1,
            "FULLY_CONNECTED": 1,
            "SOFTMAX": 1,
        },
        tensors=183,
        compiled=False,
        first_ids=("subgraph0/QUANTIZE#0", "subgraph0/CONV_2D#0"),
        # Its first conv: 3x3/2, 224x224x3 -> 112x112x32.
        macs={"subgraph0/CONV_2D#0": 112 * 112 * 32 * 3 * 3 * 3},
    ),
    ModelCase(
        f"{MOBILENET_V2}_edgetpu.tflite",
        {"edgetpu-custom-op": 1},
        tensors=2,
        compiled=True,
        inputs=("serving_default_mobilenetv2_1.00_224_input:0",),
        outputs=("StatefulPartitionedCall:0",),
        executable_bytes=3268692,
    ),
    ModelCase(
        f"{YOLO}.tflite",
        {
            "PAD": 7,
            "CONV_2D": 64,
            "LOGISTIC": 58,
            "MUL": 59,
            "STRIDED_SLICE": 20,
            "ADD": 8,
            "CONCATENATION": 18,
            "MAX_POOL_2D": 3,
            "QUANTIZE": 3,
            "RESIZE_NEAREST_NEIGHBOR": 2,
            "TRANSPOSE": 5,
            "RESHAPE": 6,
            "SOFTMAX": 1,
            "SUB": 2,
        },
        tensors=413,
        compiled=False,
        first_ids=("subgraph0/PAD#0", "subgraph0/CONV_2D#0"),
        inputs=("serving_default_images:0",),
        # Stem conv of YOLOv8n: 3x3/2 on the padded 322x322x3 input -> 160x160x16.
        macs={"subgraph0/CONV_2D#0": 160 * 160 * 16 * 3 * 3 * 3},
    ),
    ModelCase(
        f"{YOLO}_edgetpu.tflite",
        {
            "edgetpu-custom-op": 1,
            "TRANSPOSE": 3,
            "RESHAPE": 4,
            "CONCATENATION": 2,
            "STRIDED_SLICE": 4,
            "SOFTMAX": 1,
            "CONV_2D": 1,
            "MUL": 2,
            "SUB": 2,
            "ADD": 2,
            "LOGISTIC": 1,
            "QUANTIZE": 1,
        },
        tensors=45,
        compiled=True,
        inputs=("serving_default_images:0",),
        executable_bytes=3866708,
        cpu_op_count=23,
    ),
    ModelCase(
        "edgetpu/coral_test_data/mobilenet_v1_0.25_128_quant.tflite",
        {"CONV_2D": 15, "DEPTHWISE_CONV_2D": 13, "AVERAGE_POOL_2D": 1, "RESHAPE": 1, "SOFTMAX": 1},
        tensors=89,
        compiled=False,
        inputs=("input",),
        outputs=("MobilenetV1/Predictions/Reshape_1",),
        total_macs=mobilenet_v1_macs(0.25, 128),
    ),
    ModelCase(
        "edgetpu/coral_test_data/mobilenet_v1_0.5_160_quant.tflite",
        {"CONV_2D": 15, "DEPTHWISE_CONV_2D": 13, "AVERAGE_POOL_2D": 1, "RESHAPE": 1, "SOFTMAX": 1},
        tensors=89,
        compiled=False,
        total_macs=mobilenet_v1_macs(0.5, 160),
    ),
    ModelCase(
        "edgetpu/coral_test_data/keras_lstm_mnist_ptq.tflite",
        {"QUANTIZE": 2, "UNIDIRECTIONAL_SEQUENCE_LSTM": 1, "RESHAPE": 1, "FULLY_CONNECTED": 1, "SOFTMAX": 1},
        tensors=29,
        compiled=False,
        inputs=("serving_default_x:0",),
        outputs=("StatefulPartitionedCall:0",),
    ),
    ModelCase(
        "edgetpu/coral_test_data/keras_lstm_mnist_ptq_edgetpu.tflite",
        {"edgetpu-custom-op": 1},
        tensors=4,
        compiled=True,
        inputs=("serving_default_x:0",),
        executable_bytes=139348,
    ),
    ModelCase(
        "edgetpu/coral_test_data/tools/split_concat.tflite",
        {"CONCATENATION": 2, "SPLIT": 1},
        tensors=12,
        compiled=False,
        inputs=("input1", "inputs/rnn1", "inputs/rnn2"),
        outputs=("concat/split0", "concat/split2", "concat/split4", "outputs/rnn1", "outputs/rnn2"),
    ),
    ModelCase(
        "edgetpu/coral_test_data/tools/split_concat_edgetpu.tflite",
        {"edgetpu-custom-op": 1},
        tensors=8,
        compiled=True,
        inputs=("input1", "inputs/rnn1", "inputs/rnn2"),
    ),
    ModelCase(
        f"{PIPELINE}_segment_0_of_2_edgetpu.tflite",
        {"edgetpu-custom-op": 1},
        tensors=4,
        compiled=True,
        inputs=("normalized_input_image_tensor",),
        executable_bytes=3117140,
    ),
    ModelCase(
        f"{PIPELINE}_segment_1_of_2_edgetpu.tflite",
        {"edgetpu-custom-op": 1, "DEQUANTIZE": 2, "TFLite_Detection_PostProcess": 1},
        tensors=12,
        compiled=True,
        first_ids=(
            "subgraph0/edgetpu-custom-op#0",
            "subgraph0/DEQUANTIZE#0",
            "subgraph0/DEQUANTIZE#1",
            "subgraph0/TFLite_Detection_PostProcess#0",
        ),
        outputs=(
            "TFLite_Detection_PostProcess",
            "TFLite_Detection_PostProcess:1",
            "TFLite_Detection_PostProcess:2",
            "TFLite_Detection_PostProcess:3",
        ),
        cpu_op_count=3,
        cpu_ops=(
            "subgraph0/DEQUANTIZE#0",
            "subgraph0/DEQUANTIZE#1",
            "subgraph0/TFLite_Detection_PostProcess#0",
        ),
    ),
]


@pytest.mark.parametrize("case", MODEL_CASES, ids=lambda case: Path(case.fixture).name)
def test_tflite_model_reader(case: ModelCase) -> None:
    recovery = TFLiteModelReader(vendor_fixture(case.fixture)).read()
    assert recovery.backend == "edgetpu"
    assert recovery.sources[0].format == "tflite"
    assert op_types(recovery) == case.op_counts
    assert len(recovery.tensors) == case.tensors
    assert recovery.attributes["compiled_for_edgetpu"] is case.compiled
    assert [op.id for op in recovery.operators[: len(case.first_ids)]] == list(case.first_ids)
    assert [op.index for op in recovery.operators] == list(range(len(recovery.operators)))
    subgraph = recovery.attributes["subgraphs"][0]
    if case.inputs:
        assert tuple(subgraph["inputs"]) == case.inputs
    if case.outputs:
        assert sorted(subgraph["outputs"]) == sorted(case.outputs)
    macs = {op.id: op.macs for op in recovery.operators}
    for op_id, expected in case.macs.items():
        assert macs[op_id] == expected, op_id
        assert next(op.flops for op in recovery.operators if op.id == op_id) == 2 * expected
    if case.total_macs is not None:
        assert sum(m for m in macs.values() if m is not None) == case.total_macs
    if case.constant_tensors is not None:
        assert sum(t.constant for t in recovery.tensors) == case.constant_tensors
    custom = [op for op in recovery.operators if op.op == "tflite.edgetpu-custom-op"]
    if case.executable_bytes is not None:
        assert custom[0].attributes["custom_options_bytes"] == case.executable_bytes
    if case.compiled:
        kinds = Counter(p.kind for p in recovery.partitions)
        assert kinds == Counter(
            {"edgetpu-custom-op": len(custom), **({"cpu": 1} if case.cpu_op_count else {})}
        )
        cpu = [p.operator_ids for p in recovery.partitions if p.kind == "cpu"]
        assert len(cpu[0] if cpu else ()) == case.cpu_op_count
        if case.cpu_ops:
            assert cpu[0] == case.cpu_ops
        assert all(op.partition is not None for op in recovery.operators)
    else:
        assert recovery.partitions == ()


def test_franco_fc_operands_carry_shapes_dtypes_and_weight_bytes() -> None:
    recovery = TFLiteModelReader(vendor_fixture(f"{FRANCO}.tflite")).read()
    dense = next(op for op in recovery.operators if op.id == "subgraph0/FULLY_CONNECTED#0")
    activation, weights, bias = dense.inputs
    assert (activation.name, activation.shape, activation.dtype, activation.bytes) == (
        "tfl.reshape",
        (1, 784),
        "i8",
        784,
    )
    assert (weights.shape, weights.dtype, weights.bytes) == ((128, 784), "i8", 128 * 784)
    assert (bias.name, bias.shape, bias.dtype, bias.bytes) == ("dense/bias", (128,), "i32", 128 * 4)
    assert dense.outputs[0].shape == (1, 128)
    assert dense.name == "tfl.fully_connected"
    assert dense.bytes == 784 + 128 * 784 + 128 * 4 + 128
    weight_tensor = next(t for t in recovery.tensors if t.name == "std.constant1")
    assert (weight_tensor.constant, weight_tensor.bytes, weight_tensor.producer) == (True, 128 * 784, None)
    assert weight_tensor.consumers == ("subgraph0/FULLY_CONNECTED#0",)


def test_yolov8n_compiled_custom_op_boundary_names() -> None:
    recovery = TFLiteModelReader(vendor_fixture(f"{YOLO}_edgetpu.tflite")).read()
    custom = recovery.operators[0]
    assert custom.op == "tflite.edgetpu-custom-op"
    assert [v.name for v in custom.inputs] == ["serving_default_images:0"]
    assert [v.name for v in custom.outputs] == [
        "model/tf.reshape_2/Reshape",
        "model/tf.reshape_1/Reshape",
        "model/tf.concat_10/concat",
    ]
    assert [v.shape for v in custom.outputs] == [(1, 144, 100), (1, 144, 400), (1, 40, 40, 144)]
    assert custom.module_path == ("model", "tf.reshape_2", "Reshape")


def test_yolov8n_reads_well_under_a_second() -> None:
    import time

    path = vendor_fixture(f"{YOLO}.tflite")
    start = time.perf_counter()
    recovery = TFLiteModelReader(path).read()
    assert len(recovery.operators) == 256
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("fixture", fixture_files("*.tflite"))
def test_every_tflite_fixture_reads(fixture: str) -> None:
    path = vendor_fixture(fixture)
    assert TFLiteModelReader.recognises(path, read_head(path))
    recovery = TFLiteModelReader(path).read()
    assert recovery.operators
    assert len({op.id for op in recovery.operators}) == len(recovery.operators)
    assert all(op.op.startswith("tflite.") for op in recovery.operators)


# ---------------------------------------------------------------------------- operation logs


@dataclass(frozen=True)
class LogCase:
    fixture: str
    version: str
    input_model: str
    output_model: str
    rows: int
    total: int
    mapped: int
    #: Some op types with their {status: count}, as the table lists them.
    counts: dict[str, dict[str, int]] = field(default_factory=dict)


LOG_CASES = [
    LogCase(
        f"{FRANCO}_edgetpu.log",
        "15.0.340273435",
        "model.tflite",
        "model_edgetpu.tflite",
        rows=2,
        total=3,
        mapped=3,
        counts={"RESHAPE": {MAPPED: 1}, "FULLY_CONNECTED": {MAPPED: 2}},
    ),
    LogCase(
        f"{MOBILENET_V2}_edgetpu.log",
        "16.0.384591198",
        "mobilenet_v2_1.0_224_quant.tflite",
        "mobilenet_v2_1.0_224_quant_edgetpu.tflite",
        rows=8,
        total=72,
        mapped=72,
        counts={"CONV_2D": {MAPPED: 36}, "DEPTHWISE_CONV_2D": {MAPPED: 17}, "QUANTIZE": {MAPPED: 2}},
    ),
    LogCase(
        f"{YOLO}_edgetpu.log",
        "16.0.384591198",
        "yolov8n_saved_model/yolov8n_full_integer_quant.tflite",
        "yolov8n_saved_model/yolov8n_full_integer_quant_edgetpu.tflite",
        rows=26,
        total=256,
        mapped=233,
        counts={
            "CONV_2D": {SUBGRAPHS: 1, MAPPED: 63},
            "RESHAPE": {MAPPED: 2, SUBGRAPHS: 3, UNSPECIFIED: 1},
            "STRIDED_SLICE": {UNSPECIFIED: 2, SUBGRAPHS: 2, MAPPED: 16},
            "TRANSPOSE": {UNSPECIFIED: 3, MAPPED: 2},
            "SOFTMAX": {SUBGRAPHS: 1},
        },
    ),
    LogCase(
        "edgetpu/goalbuddy_yolov8_v16/yolov8s_full_integer_quant_edgetpu.log",
        "16.0.384591198",
        "yolov8s_saved_model/yolov8s_full_integer_quant.tflite",
        "yolov8s_saved_model/yolov8s_full_integer_quant_edgetpu.tflite",
        rows=26,
        total=256,
        mapped=233,
        counts={"LOGISTIC": {SUBGRAPHS: 1, MAPPED: 57}},
    ),
    LogCase(
        "edgetpu/goalbuddy_yolov8_v16/yolov8m_full_integer_quant_edgetpu.log",
        "16.0.384591198",
        "yolov8m_saved_model/yolov8m_full_integer_quant.tflite",
        "yolov8m_saved_model/yolov8m_full_integer_quant_edgetpu.tflite",
        rows=26,
        total=322,
        mapped=299,
        counts={"CONV_2D": {SUBGRAPHS: 1, MAPPED: 83}, "MUL": {MAPPED: 77, SUBGRAPHS: 2}},
    ),
    LogCase(
        "edgetpu/id_card_matching_v2.1/model_edgetpu.log",
        "2.1.302470888",
        "model.tflite",
        "model_edgetpu.tflite",
        rows=8,
        total=77,
        mapped=75,
        counts={"QUANTIZE": {UNSPECIFIED: 1}, "DEQUANTIZE": {UNSUPPORTED_TYPE: 1}, "CONV_2D": {MAPPED: 53}},
    ),
    LogCase(
        "edgetpu/intflow_ssd_v2.1/output_tflite_graph_edgetpu.log",
        "2.1.302470888",
        "learn/models/output_tflite_graph.tflite",
        "output_tflite_graph_edgetpu.tflite",
        rows=7,
        total=99,
        mapped=98,
        counts={"CUSTOM": {UNSUPPORTED_TYPE: 1}, "CONV_2D": {MAPPED: 55}},
    ),
    LogCase(
        "edgetpu/nasassai_float_v16/model_edgetpu.log",
        "16.0.384591198",
        "model.tflite",
        "model_edgetpu.tflite",
        rows=3,
        total=4,
        mapped=0,
        counts={"FULLY_CONNECTED": {UNSUPPORTED_TYPE: 2}},
    ),
    LogCase(
        "edgetpu/camera_detection_yolov5_v16/best-int8_edgetpu.log",
        "16.0.384591198",
        "drive/MyDrive/YOLO/yolov5-master/best-int8.tflite",
        "drive/MyDrive/YOLO/yolov5-master/best-int8_edgetpu.tflite",
        rows=19,
        total=262,
        mapped=123,
        counts={"QUANTIZE": {SUBGRAPHS: 5, UNSPECIFIED: 1, MAPPED: 1}, "MUL": {SUBGRAPHS: 41, MAPPED: 34}},
    ),
    LogCase(
        "edgetpu/hatef2003_v16/model_int8_edgetpu.log",
        "16.0.384591198",
        "model_int8.tflite",
        "model_int8_edgetpu.tflite",
        rows=12,
        total=386,
        mapped=1,
        counts={"PAD": {SUBGRAPHS: 16, MAPPED: 1}, "TRANSPOSE": {UNSPECIFIED: 38, SUBGRAPHS: 28}},
    ),
    LogCase(
        "edgetpu/hatef2003_v16/lane_keeper_edgetpu_edgetpu.log",
        "16.0.384591198",
        "lane_keeper_edgetpu.tflite",
        "lane_keeper_edgetpu_edgetpu.tflite",
        rows=10,
        total=386,
        mapped=0,
        counts={"TRANSPOSE": {UNSUPPORTED_TYPE: 66}},
    ),
]


@pytest.mark.parametrize("case", LOG_CASES, ids=lambda case: case.fixture.split("/", 1)[1])
def test_operation_log_reader(case: LogCase) -> None:
    path = vendor_fixture(case.fixture)
    log = OperationLogReader(path).log()
    assert (log.compiler_version, log.input_model, log.output_model) == (
        case.version,
        case.input_model,
        case.output_model,
    )
    assert (len(log.rows), log.total, log.mapped) == (case.rows, case.total, case.mapped)
    for op_type, by_status in case.counts.items():
        assert log.counts()[op_type] == by_status, op_type

    recovery = OperationLogReader(path).read()
    assert recovery.sources[0].format == "edgetpu-oplog"
    assert recovery.attributes["compiler_version"] == case.version
    assert recovery.attributes["operations_total"] == case.total
    assert recovery.attributes["operations_mapped"] == case.mapped
    # One queryable figure per table row, pointing back at its line.
    rows = [m for m in recovery.measurements if m.name == "operation_count"]
    assert len(rows) == case.rows
    assert sum(m.value or 0 for m in rows) == case.total
    assert sum(m.value or 0 for m in rows if m.attributes["mapped"]) == case.mapped
    assert all(m.origin and m.origin.startswith(f"{path}:") for m in rows)


@pytest.mark.parametrize("fixture", fixture_files("*.log"))
def test_every_operation_log_fixture_reads(fixture: str) -> None:
    path = vendor_fixture(fixture)
    assert OperationLogReader.recognises(path, read_head(path))
    log = OperationLogReader(path).log()
    assert log.rows and log.total > 0


# ---------------------------------------------------------------------------- console summary

DEEPPICAR = "edgetpu/deeppicar_cocompile_stdout_v16/log.txt"

CONSOLE_MODELS = [
    # One dict per block of the co-compile, as printed (sizes converted: KiB = 1024 B).
    {
        "model": "lane_navigation_w_pretrain_final",
        "output_model": "co_compiled_model/lane_navigation_w_pretrain_final_edgetpu.tflite",
        "input_bytes": round(258.55 * 1024),
        "output_bytes": round(380.62 * 1024),
        "on_chip_cached_bytes": round(322.25 * 1024),
        "on_chip_remaining_bytes": round(2.98 * 1024 * 1024),
        "off_chip_streamed_bytes": 0,
        "edgetpu_subgraphs": 1,
        "operations_total": 12,
        "operations_on_edgetpu": None,
        "operations_on_cpu": None,
        "operation_log": "co_compiled_model/lane_navigation_w_pretrain_final_edgetpu.log",
    },
    {
        "model": "efficientdet-lite",
        "output_model": "co_compiled_model/efficientdet-lite_edgetpu.tflite",
        "input_bytes": round(4.25 * 1024 * 1024),
        "output_bytes": round(5.57 * 1024 * 1024),
        "on_chip_cached_bytes": round(4.21 * 1024 * 1024),
        "on_chip_remaining_bytes": round(2.98 * 1024 * 1024),
        "off_chip_streamed_bytes": 0,
        "edgetpu_subgraphs": 1,
        "operations_total": 267,
        "operations_on_edgetpu": 264,
        "operations_on_cpu": 3,
        "operation_log": "co_compiled_model/efficientdet-lite_edgetpu.log",
    },
]


def test_console_summary_of_a_co_compile() -> None:
    summary = ConsoleSummaryReader(vendor_fixture(DEEPPICAR)).summary()
    assert (
        summary.compiler_version,
        summary.compile_time_s,
        summary.compile_timeout_s,
        summary.succeeded,
    ) == ("16.0.384591198", 1.717, 180, True)
    assert [
        {key: getattr(block, key) if key != "model" else block.model for key in expected}
        for block, expected in zip(summary.models, CONSOLE_MODELS, strict=True)
    ] == CONSOLE_MODELS
    assert summary.models[1].texts["on_chip_cached_bytes"] == "4.21MiB"


@pytest.mark.parametrize(
    ("model", "name", "kind", "value", "text"),
    [
        ("lane_navigation_w_pretrain_final", "on_chip_parameter_bytes", "memory", 322.25 * 1024, "322.25KiB"),
        ("lane_navigation_w_pretrain_final", "off_chip_parameter_bytes", "memory", 0, "0.00B"),
        ("lane_navigation_w_pretrain_final", "operations_total", "metric", 12, "12"),
        ("efficientdet-lite", "on_chip_parameter_bytes", "memory", round(4.21 * 1024 * 1024), "4.21MiB"),
        (
            "efficientdet-lite",
            "on_chip_parameter_bytes_remaining",
            "memory",
            round(2.98 * 1024 * 1024),
            "2.98MiB",
        ),
        ("efficientdet-lite", "edgetpu_subgraphs", "metric", 1, "1"),
        ("efficientdet-lite", "operations_on_edgetpu", "metric", 264, "264"),
        ("efficientdet-lite", "operations_on_cpu", "metric", 3, "3"),
    ],
)
def test_console_summary_measurements(model: str, name: str, kind: str, value: float, text: str) -> None:
    recovery = ConsoleSummaryReader(vendor_fixture(DEEPPICAR)).read()
    found = [m for m in recovery.measurements if m.name == name and m.attributes["model"] == model]
    assert [(m.kind, m.value, m.attributes["text"]) for m in found] == [(kind, value, text)]


def test_console_summary_compile_time_and_missing_split() -> None:
    recovery = ConsoleSummaryReader(vendor_fixture(DEEPPICAR)).read()
    compile_total = [m for m in recovery.measurements if m.kind == "compile"]
    assert [(m.name, m.value, m.unit) for m in compile_total] == [("compile.total", 1.717, "s")]
    assert compile_total[0].attributes["models"] == ["lane_navigation_w_pretrain_final", "efficientdet-lite"]
    # The first block prints no TPU/CPU split: no figure is invented for it.
    lane = [
        m.name
        for m in recovery.measurements
        if m.attributes.get("model") == "lane_navigation_w_pretrain_final"
    ]
    assert "operations_on_cpu" not in lane
    assert recovery.attributes["co_compiled"] is True


# ---------------------------------------------------------------------------- recognition


@pytest.mark.parametrize("fixture", fixture_files("*"))
def test_each_fixture_is_recognised_by_exactly_one_reader(fixture: str) -> None:
    path = vendor_fixture(fixture)
    expected = {".tflite": "tflite", ".log": "edgetpu-oplog", ".txt": "edgetpu-console"}[path.suffix]
    head = read_head(path)
    assert [reader.format for reader in READERS if reader.recognises(path, head)] == [expected]


def test_capabilities_descriptor() -> None:
    descriptor = capabilities()
    assert (descriptor["backend"], descriptor["path"]) == ("edgetpu", "reconstruction")
    assert set(descriptor["exposes"]) == set(ASPECTS)
    assert descriptor["exposes"]["per_op_timing"] == "none"
    assert descriptor["exposes"]["compiler_ir"] == "none"


# ---------------------------------------------------------------------------- reconstruct


@pytest.fixture(scope="module")
def yolo() -> Recovery:
    return reconstruct(
        [vendor_fixture(f"{YOLO}{suffix}") for suffix in (".tflite", "_edgetpu.tflite", "_edgetpu.log")]
    )


def notes(recovery: Recovery, aspect: str) -> list[tuple[Coverage, str]]:
    return [(note.status, note.detail) for note in recovery.coverage if note.aspect == aspect]


def test_mobilenet_v2_log_counts_the_original_ops_all_inside_one_custom_op() -> None:
    original = TFLiteModelReader(vendor_fixture(f"{MOBILENET_V2}.tflite")).read()
    log = OperationLogReader(vendor_fixture(f"{MOBILENET_V2}_edgetpu.log")).log()
    assert len(original.operators) == 72 == log.total

    recovery = reconstruct([vendor_fixture(f"{MOBILENET_V2}.tflite").parent])
    scope = "mobilenet_v2_1.0_224_quant"
    [partition] = recovery.partitions
    assert (partition.id, partition.kind) == (f"{scope}_edgetpu/edgetpu#0", "edgetpu-custom-op")
    assert partition.operator_ids == tuple(f"{scope}/{op.id}" for op in original.operators)
    originals = [op for op in recovery.operators if op.id.startswith(f"{scope}/")]
    assert len(originals) == 72
    assert {(op.partition, op.status) for op in originals} == {(partition.id, MAPPED)}
    assert notes(recovery, "partitions") == [
        (Coverage.RECOVERED, "one edgetpu-custom-op partition per custom op and a cpu partition")
    ]
    assert notes(recovery, "lineage")[0][0] is Coverage.RECOVERED
    assert recovery.attributes["models"][scope]["matched"] is True
    assert recovery.attributes["compiler_versions"] == ["16.0.384591198"]


def test_yolov8n_log_counts_sum_to_the_original_op_count(yolo: Recovery) -> None:
    log = OperationLogReader(vendor_fixture(f"{YOLO}_edgetpu.log")).log()
    original = TFLiteModelReader(vendor_fixture(f"{YOLO}.tflite")).model()
    assert log.total == len(original.operators) == 256
    assert log.counts_by_type() == dict(Counter(op.op_type for op in original.operators))


def test_yolov8n_partitions_from_boundary_tensor_names(yolo: Recovery) -> None:
    edgetpu, cpu = yolo.partitions
    assert (edgetpu.kind, len(edgetpu.operator_ids)) == ("edgetpu-custom-op", 233)
    assert (cpu.kind, len(cpu.operator_ids)) == ("cpu", 23)
    assert edgetpu.attributes["boundary_outputs"] == [
        "model/tf.reshape_2/Reshape",
        "model/tf.reshape_1/Reshape",
        "model/tf.concat_10/concat",
    ]
    originals = [op for op in yolo.operators if op.id.startswith("yolov8n_full_integer_quant/")]
    assert len(originals) == 256
    assert Counter(op.partition for op in originals) == {edgetpu.id: 233, cpu.id: 23}
    # Matching agrees with the log per op type: mapped ops inside, the others on the CPU.
    log = OperationLogReader(vendor_fixture(f"{YOLO}_edgetpu.log")).log()
    on_tpu = Counter(op.op.removeprefix("tflite.") for op in originals if op.partition == edgetpu.id)
    on_cpu = Counter(op.op.removeprefix("tflite.") for op in originals if op.partition == cpu.id)
    assert on_tpu == {k: v for k, v in log.mapped_by_type().items() if v}
    assert on_cpu == {k: v for k, v in log.not_mapped_by_type().items() if v}
    assert [status for status, _ in notes(yolo, "partitions")] == [Coverage.RECOVERED]


def test_yolov8n_cpu_ops_are_the_tail_of_the_graph(yolo: Recovery) -> None:
    cpu_ops = [op for op in yolo.operators if op.partition and op.partition.endswith("/cpu")]
    assert [op.index for op in cpu_ops] == list(range(233, 256))
    first = cpu_ops[0]
    assert (first.id, first.name) == (
        "yolov8n_full_integer_quant/subgraph0/TRANSPOSE#2",
        "model/tf.compat.v1.transpose/transpose",
    )
    assert first.attributes["compiled_op"] == "yolov8n_full_integer_quant_edgetpu/subgraph0/TRANSPOSE#0"
    # A status comes from the log where the op type has one non-mapped row ...
    statuses = {op.op: op.status for op in cpu_ops}
    assert statuses["tflite.TRANSPOSE"] == UNSPECIFIED
    assert statuses["tflite.SOFTMAX"] == SUBGRAPHS
    assert statuses["tflite.CONV_2D"] == SUBGRAPHS
    # ... and none, with the candidate reasons and their counts, where the log splits
    # the type over two (RESHAPE: 3 x subgraphs, 1 x unspecified; no made-up "cpu").
    reshape = next(op for op in cpu_ops if op.op == "tflite.RESHAPE")
    assert reshape.status is None
    assert reshape.attributes["status_candidates"] == {SUBGRAPHS: 3, UNSPECIFIED: 1}


def test_yolov8n_custom_op_record_and_log_rows(yolo: Recovery) -> None:
    [custom] = [op for op in yolo.operators if op.op == "tflite.edgetpu-custom-op"]
    assert custom.id == "yolov8n_full_integer_quant_edgetpu/subgraph0/edgetpu-custom-op#0"
    assert len(custom.attributes["absorbed_operator_ids"]) == 233
    # Compiled CPU ops and boundary tensors are folded into the original records.
    assert not any(
        op.id.startswith("yolov8n_full_integer_quant_edgetpu/") and op is not custom for op in yolo.operators
    )
    assert len(yolo.tensors) == 413
    rows = {(m.attributes["op_type"], m.attributes["status"]): m for m in yolo.measurements}
    conv = rows["CONV_2D", MAPPED]
    assert (conv.value, len(conv.ids), conv.partition) == (63, 63, yolo.partitions[0].id)
    softmax = rows["SOFTMAX", SUBGRAPHS]
    assert softmax.ids == ("yolov8n_full_integer_quant/subgraph0/SOFTMAX#0",)


def test_franco_fc_reconstruction_with_macs() -> None:
    recovery = reconstruct([vendor_fixture(f"{FRANCO}.tflite").parent])
    [partition] = recovery.partitions
    assert partition.operator_ids == (
        "model/subgraph0/RESHAPE#0",
        "model/subgraph0/FULLY_CONNECTED#0",
        "model/subgraph0/FULLY_CONNECTED#1",
    )
    macs = {op.id: op.macs for op in recovery.operators}
    assert macs["model/subgraph0/FULLY_CONNECTED#0"] == 28 * 28 * 128
    assert macs["model/subgraph0/FULLY_CONNECTED#1"] == 128 * 10
    assert partition.attributes["absorbed_macs"] == 28 * 28 * 128 + 128 * 10
    assert partition.attributes["executable_bytes"] == 143418
    assert {op.status for op in recovery.operators} == {MAPPED}
    assert recovery.attributes["compiler_versions"] == ["15.0.340273435"]


def test_pipeline_segment_without_its_original() -> None:
    path = vendor_fixture(f"{PIPELINE}_segment_1_of_2_edgetpu.tflite")
    recovery = reconstruct([path])
    scope = path.stem
    assert [(op.op, op.partition) for op in recovery.operators] == [
        ("tflite.edgetpu-custom-op", f"{scope}/edgetpu#0"),
        ("tflite.DEQUANTIZE", f"{scope}/cpu"),
        ("tflite.DEQUANTIZE", f"{scope}/cpu"),
        ("tflite.TFLite_Detection_PostProcess", f"{scope}/cpu"),
    ]
    assert notes(recovery, "lineage")[0][0] is Coverage.NOT_EXPOSED
    assert notes(recovery, "operators")[0][0] is Coverage.PARTIAL


def test_coral_test_data_groups_models_including_a_co_compile() -> None:
    recovery = reconstruct([vendor_fixture("edgetpu/coral_test_data")])
    models = recovery.attributes["models"]
    matched = {key for key, group in models.items() if group["matched"]}
    assert matched == {
        "mobilenet_v1_0.25_128_quant",
        "keras_lstm_mnist_ptq",
        "split_concat",
        # its original sits one directory up and no other compile took it
        "mobilenet_v1_0.5_160_quant",
    }
    absorbed = {
        p.attributes["model"]: p.attributes.get("absorbed_op_count")
        for p in recovery.partitions
        if p.kind == "edgetpu-custom-op" and "absorbed_op_count" in p.attributes
    }
    assert absorbed == {
        "mobilenet_v1_0.25_128_quant": 31,
        "mobilenet_v1_0.5_160_quant": 31,
        "keras_lstm_mnist_ptq": 6,
        "split_concat": 3,
    }
    ids = [op.id for op in recovery.operators]
    assert len(ids) == len(set(ids))
    assert recovery.attributes["ignored_files"] == []


def test_console_summary_through_reconstruct() -> None:
    recovery = reconstruct([vendor_fixture(DEEPPICAR)])
    memory = {(m.attributes["model"], m.name): m.value for m in recovery.measurements if m.kind == "memory"}
    assert memory[("efficientdet-lite", "on_chip_parameter_bytes")] == round(4.21 * 1024 * 1024)
    assert memory[("lane_navigation_w_pretrain_final", "off_chip_parameter_bytes")] == 0
    # No model file of that compile was given: the figures stay, tied to no partition.
    assert all(m.partition is None for m in recovery.measurements)
    assert [status for status, _ in notes(recovery, "memory")] == [Coverage.PARTIAL] * 3
    assert recovery.attributes["console"][0]["compile_time_s"] == 1.717


def test_disagreement_with_the_log_is_a_coverage_note(tmp_path: Path) -> None:
    for name in ("model.tflite", "model_edgetpu.tflite"):
        (tmp_path / name).write_bytes(vendor_fixture(f"edgetpu/franco_fc_v15/{name}").read_bytes())
    # Synthetic log: claims one dense layer stayed on the CPU, which the models contradict.
    (tmp_path / "model_edgetpu.log").write_text(
        "Edge TPU Compiler version 16.0.384591198\nInput: model.tflite\nOutput: model_edgetpu.tflite\n\n"
        "Operator                       Count      Status\n\n"
        f"RESHAPE                        1          {MAPPED}\n"
        f"FULLY_CONNECTED                1          {MAPPED}\n"
        f"FULLY_CONNECTED                1          {UNSUPPORTED_TYPE}\n"
    )
    (tmp_path / "synthetic_notes.txt").write_text("not an Edge TPU artifact\n")
    recovery = reconstruct([tmp_path])
    found = notes(recovery, "partitions")
    assert found[0][0] is Coverage.PARTIAL
    assert (
        Coverage.PARTIAL,
        "model: FULLY_CONNECTED: the models give 2 mapped ops, the operation log 1",
    ) in found
    assert (
        Coverage.PARTIAL,
        "model: FULLY_CONNECTED: the models give 0 CPU ops, the operation log 1",
    ) in found
    assert recovery.attributes["ignored_files"] == [str(tmp_path / "synthetic_notes.txt")]


def test_console_figures_attach_to_the_custom_op_of_the_model_they_name(tmp_path: Path) -> None:
    for name in ("model.tflite", "model_edgetpu.tflite", "model_edgetpu.log"):
        (tmp_path / name).write_bytes(vendor_fixture(f"edgetpu/franco_fc_v15/{name}").read_bytes())
    # Synthetic stdout in the v16 console style (the real co-compile capture names models
    # that are not public); the total op count is deliberately wrong.
    (tmp_path / "synthetic_stdout.txt").write_text(
        "Edge TPU Compiler version 15.0.340273435\n\nModel compiled successfully in 42 ms.\n\n"
        "Input model: model.tflite\nInput size: 101.67KiB\nOutput model: model_edgetpu.tflite\n"
        "On-chip memory used for caching model parameters: 100.75KiB\n"
        "Off-chip memory used for streaming uncached model parameters: 0.00B\n"
        "Number of Edge TPU subgraphs: 1\nTotal number of operations: 4\n"
        "Operation log: model_edgetpu.log\n"
    )
    recovery = reconstruct([tmp_path])
    on_chip = [m for m in recovery.measurements if m.name == "on_chip_parameter_bytes"]
    assert [(m.value, m.partition) for m in on_chip] == [(100.75 * 1024, "model_edgetpu/edgetpu#0")]
    assert recovery.attributes["models"]["model"]["console"][0]["on_chip_cached_bytes"] == 100.75 * 1024
    problems = [detail for status, detail in notes(recovery, "partitions") if "console summary" in detail]
    assert problems == [
        f"model: the console summary ({tmp_path / 'synthetic_stdout.txt'}:5) gives 4 ops, "
        "the original model has 3"
    ]


# ---------------------------------------------------------------------------- errors


def test_truncated_tflite_is_an_artifact_error(tmp_path: Path) -> None:
    data = vendor_fixture(f"{FRANCO}.tflite").read_bytes()
    path = tmp_path / "truncated.tflite"
    path.write_bytes(data[: len(data) // 2])
    assert TFLiteModelReader.recognises(path, read_head(path))
    with pytest.raises(ArtifactError, match=rf"^{path}: corrupt or truncated TFLite"):
        TFLiteModelReader(path).read()
    with pytest.raises(ArtifactError, match=str(path)):
        reconstruct([tmp_path])


def test_malformed_log_row_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "synthetic_bad_edgetpu.log"
    path.write_text(
        "Edge TPU Compiler version 16.0.384591198\nInput: m.tflite\nOutput: m_edgetpu.tflite\n\n"
        "Operator                       Count      Status\n\n"
        f"CONV_2D                        3          {MAPPED}\n"
        f"ADD                            many       {MAPPED}\n"
    )
    assert OperationLogReader.recognises(path, read_head(path))
    # One bad row does not lose the file: it is an unparsed line with its reason.
    recovery = OperationLogReader(path).read()
    assert [m.attributes["op_type"] for m in recovery.measurements] == ["CONV_2D"]
    lines = recovery.sources[0].lines
    assert lines is not None and (lines.total, lines.consumed, lines.unparsed) == (8, 7, 1)
    assert lines.examples == ((8, f"ADD                            many       {MAPPED}"),)
    [(number, why)] = lines.problems
    assert number == 8 and why.startswith("malformed operation table row")
    # A file of nothing but that row is an error naming the line.
    only = tmp_path / "synthetic_only_bad_edgetpu.log"
    only.write_text(f"ADD   many   {MAPPED}\n")
    with pytest.raises(ArtifactError, match=rf"^{only}: no line of this file is recognisable"):
        OperationLogReader(only).read()


def test_malformed_console_size_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "synthetic_stdout.txt"
    path.write_text(
        "Edge TPU Compiler version 16.0.384591198\n\nInput model: m.tflite\n"
        "On-chip memory used for caching model parameters: lots\n"
    )
    assert ConsoleSummaryReader.recognises(path, read_head(path))
    summary = ConsoleSummaryReader(path).summary()
    assert summary.models[0].on_chip_cached_bytes is None
    assert summary.lines is not None
    [(number, why)] = summary.lines.problems
    assert number == 4 and why.startswith("On-chip memory used for caching model parameters: 'lots' is not a size")


def test_missing_path_is_an_artifact_error(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="no such file"):
        reconstruct([tmp_path / "absent_edgetpu.tflite"])
