"""Cerebras reconstruction readers: real artifacts (``../shared/fixtures/cerebras``, see
SOURCES.md) → the values read by hand from them, as data; synthetic CIRH dumps and a
synthetic full compile report (``tests/inputs/cerebras``, labelled SYNTHETIC in their
first line) for what no public artifact shows."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dfit_mlir.adapters import cerebras
from dfit_mlir.adapters.base import ASPECTS
from dfit_mlir.adapters.cerebras import (
    CirhReader,
    CompileReportReader,
    ConsoleLogReader,
    PerformanceJsonReader,
    RunSummaryReader,
    TrackJsonReader,
    reconstruct,
)
from dfit_mlir.adapters.cerebras import cirh as cirh_module
from dfit_mlir.adapters.recovery import ArtifactError, Coverage, Recovery, SourceLoc, read_head
from tests.conftest import REPO, VENDOR_FIXTURES, vendor_fixture

INPUTS = REPO / "tests" / "inputs" / "cerebras" / "synthetic_model_dir"
TRAIN_STEP = INPUTS / "cs_4471189405126833117" / "cirh.mlir"
TRAIN_REPORT = INPUTS / "cs_4471189405126833117" / "compile_report.txt"
CUSTOM_ASSEMBLY = INPUTS / "cs_9023117735519584405" / "ws_forward.mlir"

BERT_512 = "cerebras/alcf_bert_large_bs512_r2x/mytest.log"
BERT_2048 = "cerebras/alcf_bert_large_bs2048_r2x/mytest.log"
ARXIV = "cerebras/gnn_graphsage_arxiv_client1.1.0/arxiv_wse_cache.log"
PRODUCTS = "cerebras/gnn_graphsage_products_client1.1.0/products_wse_not.log"
JSON_DIR = "cerebras/gnn_cerebras_logs_json_client1.14.0"
PERF_1 = f"{JSON_DIR}/cerebras_logs/20260919_033144/executors/000001/performance.json"
PERF_LATEST = f"{JSON_DIR}/cerebras_logs/20260919_033144/executors/latest/performance.json"
TRACK = f"{JSON_DIR}/cerebras_logs/20260919_033144/executors/000004/track.json"
SUMMARY = f"{JSON_DIR}/20260919_033137_restartable/summary.json"
DOCQUOTE = "cerebras/docquote_compile_report/compile_report_head_unet_severstal.txt"

#: Every file of fixtures/cerebras and the reader that must take it.
FIXTURE_READERS = {
    BERT_512: ConsoleLogReader,
    BERT_2048: ConsoleLogReader,
    ARXIV: ConsoleLogReader,
    PRODUCTS: ConsoleLogReader,
    PERF_1: PerformanceJsonReader,
    PERF_LATEST: PerformanceJsonReader,
    TRACK: TrackJsonReader,
    SUMMARY: RunSummaryReader,
    DOCQUOTE: CompileReportReader,
}


def measurements(recovery: Recovery, name: str) -> list[Any]:
    return [m for m in recovery.measurements if m.name == name]


def values(recovery: Recovery, name: str) -> list[float | None]:
    return [m.value for m in measurements(recovery, name)]


def phase_duration(recovery: Recovery, phase: str) -> list[float | None]:
    return [m.duration_s for m in measurements(recovery, "compile.phase") if m.attributes["phase"] == phase]


# -- every real file --------------------------------------------------------------------


@pytest.mark.parametrize("relative", sorted(FIXTURE_READERS))
def test_every_fixture_is_recognised_by_its_reader_and_read(relative: str) -> None:
    path = vendor_fixture(relative)
    head = read_head(path)
    recognised = [reader for reader in cerebras.READERS if reader.recognises(path, head)]
    assert recognised[:1] == [FIXTURE_READERS[relative]]
    recovery = FIXTURE_READERS[relative](path).read()
    assert recovery.backend == "cerebras"
    assert recovery.measurements
    assert [source.format for source in recovery.sources] == [FIXTURE_READERS[relative].format]


def test_the_table_lists_every_cerebras_fixture() -> None:
    root = vendor_fixture("cerebras")
    found = {str(path.relative_to(VENDOR_FIXTURES)) for path in root.rglob("*") if path.is_file()}
    assert found == set(FIXTURE_READERS)


# -- console logs -----------------------------------------------------------------------


@dataclass(frozen=True)
class LogCase:
    fixture: str
    expected: dict[str, Any]


def log_facts(recovery: Recovery) -> dict[str, Any]:
    """The facts a log case checks, as one comparable dict."""
    attributes = recovery.attributes
    train_rate = measurements(recovery, "train.rate")
    processed = measurements(recovery, "processed_samples")
    compiles = measurements(recovery, "compile")
    return {
        "compile_hashes": attributes["compile_hashes"],
        "cached_compile_hashes": attributes["cached_compile_hashes"],
        "jobs": [(job["kind"], job["id"]) for job in attributes["jobs"]],
        "workflow_ids": attributes["workflow_ids"],
        "versions": attributes["versions"],
        "train_steps": [m.step for m in train_rate],
        "first_loss": values(recovery, "train.loss")[0],
        "final_rate": train_rate[-1].value,
        "final_global_rate": values(recovery, "train.global_rate")[-1],
        "processed": [(m.value, m.duration_s, m.attributes["what"]) for m in processed],
        "compile_s": [m.duration_s for m in compiles],
        "compile_status": [m.attributes["status"] for m in compiles],
        "compiling_kernels_s": phase_duration(recovery, "Compiling kernels"),
        "sub_batch_trials": [
            m.attributes["sub_batch_size"]
            for m in measurements(recovery, "compile.phase")
            if m.attributes["level"] == 1 and "sub_batch_size" in m.attributes
        ],
        "lanes": [m.attributes.get("lanes") for m in compiles],
        "num_csx": attributes["num_csx"],
        "fit_summary": {k: v for k, v in attributes.get("fit_summary", {}).items() if k != "lines"},
        "eval_loss": values(recovery, "eval.loss"),
        "eval_avg_loss": values(recovery, "eval.avg_loss"),
        "first_step_window_s": measurements(recovery, "train.steps")[0].duration_s,
    }


LOG_CASES = [
    LogCase(
        BERT_512,
        {
            "compile_hashes": ["cs_8939750200954608837"],
            "cached_compile_hashes": [],
            "jobs": [
                ("compile", "wsjob-nwjyttgpfktvyh4kpmmz5n"),
                ("execute", "wsjob-fhinsqdwzqebojjzgbkwgn"),
            ],
            "workflow_ids": [],
            "versions": {},
            "train_steps": [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000],
            "first_loss": 9.39062,
            "final_rate": 1265.96,
            "final_global_rate": 1199.57,
            "processed": [(512000.0, 426.819169997, None)],
            # 04:12:01,908 "Compiling the model" → 04:27:05,510 "Compile was successful!"
            "compile_s": [903.602],
            "compile_status": ["success"],
            "compiling_kernels_s": [204.143],  # 04:20:51,212 → 04:24:15,355 "Compiling final image"
            "sub_batch_trials": [8, 64, 32, 128, 256],
            "lanes": [6],
            "num_csx": 1,
            "fit_summary": {},
            "eval_loss": [],
            "eval_avg_loss": [],
            # 04:31:18,020 "Beginning appliance run" → Step=100 at 04:32:54,298
            "first_step_window_s": 96.278,
        },
    ),
    LogCase(
        BERT_2048,
        {
            "compile_hashes": ["cs_12842439843636108263"],
            "cached_compile_hashes": [],
            "jobs": [
                ("compile", "wsjob-nw92pqswybcl37chf7rfoq"),
                ("execute", "wsjob-z2irjuuhjvbundav2p9d56"),
            ],
            "workflow_ids": [],
            "versions": {},
            "train_steps": [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000],
            "first_loss": 9.48438,
            "final_rate": 5178.19,
            "final_global_rate": 5689.40,
            "processed": [(2048000.0, 359.967711699, None)],
            "compile_s": [903.936],
            "compile_status": ["success"],
            "compiling_kernels_s": [118.809],
            "sub_batch_trials": [8, 256, 32, 512, 128, 1024],
            "lanes": [11],
            "num_csx": 1,
            "fit_summary": {},
            "eval_loss": [],
            "eval_avg_loss": [],
            "first_step_window_s": 42.936,
        },
    ),
    LogCase(
        ARXIV,
        {
            "compile_hashes": ["cs_8573301989650966555", "cs_10916176223033685996"],
            "cached_compile_hashes": ["cs_8573301989650966555", "cs_10916176223033685996"],
            "jobs": [
                ("compile", "wsjob-my9exdbaedugjpiz4p7uh9"),
                ("execute", "wsjob-nsyy42ozw8uzrnulfcxjaz"),
                ("compile", "wsjob-acxxchmxlgbwkjb9k37mfj"),
            ],
            "workflow_ids": ["wflow-jdgkda3746rjztcbzbkxsq"],
            "versions": {"appliance client": "1.1.0", "cluster server": "1.1.2", "job operator": "1.1.2"},
            "train_steps": list(range(20, 501, 20)),
            "first_loss": 2.77244,
            "final_rate": 2469.67,
            "final_global_rate": 594.98,
            "processed": [(2048000.0, 3692.11157985, "training")],
            "compile_s": [61.427, 70.063],
            "compile_status": ["success", "success"],
            "compiling_kernels_s": [],
            "sub_batch_trials": [],
            "lanes": [None, None],
            "num_csx": 1,
            "fit_summary": {
                "train_loops": 1,
                "validation": ["val_dataloader_2 after every train loop"],
                "loop_steps": [{"loops": 1, "steps": 500}],
                "total_train_steps": 500,
                "log_every_steps": 20,
            },
            "eval_loss": [0.87779],
            "eval_avg_loss": [0.8777850307524204],
            "first_step_window_s": 28.859,
        },
    ),
    LogCase(
        PRODUCTS,
        {
            "compile_hashes": ["cs_15401457958313813015"],
            "cached_compile_hashes": ["cs_15401457958313813015"],
            "jobs": [
                ("compile", "wsjob-euj7dqhrybbivw4wj6enwv"),
                ("execute", "wsjob-hnorg22m63suqup4sf3t88"),
            ],
            "workflow_ids": ["wflow-qvfu4smtpmmndcmvud3xbw"],
            "versions": {"appliance client": "1.1.0", "cluster server": "1.1.2", "job operator": "1.1.2"},
            "train_steps": list(range(40, 1001, 40)),
            "first_loss": 1.83799,
            "final_rate": 1408.90,
            "final_global_rate": 1328.98,
            "processed": [(4096000.0, 3087.485918052, "training")],
            "compile_s": [41.131],
            "compile_status": ["success"],
            "compiling_kernels_s": [],
            "sub_batch_trials": [],
            "lanes": [None],
            "num_csx": 1,
            "fit_summary": {
                "train_loops": 1,
                "loop_steps": [{"loops": 1, "steps": 1000}],
                "total_train_steps": 1000,
                "log_every_steps": 40,
            },
            "eval_loss": [],
            "eval_avg_loss": [],
            "first_step_window_s": 111.774,
        },
    ),
]


@pytest.mark.parametrize("case", LOG_CASES, ids=lambda case: case.fixture.split("/")[1])
def test_console_log(case: LogCase) -> None:
    recovery = ConsoleLogReader(vendor_fixture(case.fixture)).read()
    assert log_facts(recovery) == case.expected


def test_log_measurements_carry_step_time_and_origin() -> None:
    recovery = ConsoleLogReader(vendor_fixture(BERT_512)).read()
    last = measurements(recovery, "train.rate")[-1]
    assert last.unit == "samples/s"
    assert last.start_s == pytest.approx(1712551105.489, abs=1e-6)  # 2024-04-08 04:38:25,489 read as UTC
    assert last.origin.endswith("mytest.log:83")
    assert last.attributes["compile_hash"] == "cs_8939750200954608837"
    window = measurements(recovery, "train.steps")[-1]
    assert (window.attributes["first_step"], window.attributes["last_step"], window.duration_s) == (
        901,
        1000,
        48.483,
    )
    assert window.value == pytest.approx(0.48483)
    saves = [(m.step, m.duration_s) for m in measurements(recovery, "checkpoint.save")]
    assert saves == [(0, 27.317), (1000, 330.65)]


def test_cached_compile_and_queue_wait_in_a_cszoo_log() -> None:
    recovery = ConsoleLogReader(vendor_fixture(ARXIV)).read()
    assert [m.attributes["cached"] for m in measurements(recovery, "compile")] == [True, True]
    waits = {m.attributes["job_id"]: m.duration_s for m in measurements(recovery, "wsjob.wait")}
    # 12:51:04,841 "Job id: wsjob-nsyy..." → 13:31:54,931 "Poll ingress success"
    assert waits["wsjob-nsyy42ozw8uzrnulfcxjaz"] == 2450.09
    eval_rate = measurements(recovery, "eval.rate")[0]
    assert (eval_rate.value, eval_rate.step, eval_rate.attributes["batch"]) == (8269.89, 500, 8)
    assert eval_rate.attributes["compile_hash"] == "cs_10916176223033685996"
    # The interleaved user prints ([Step=0020] ..., [Throughput] ...) are not records.
    assert not [m for m in recovery.measurements if "Throughput" in str(m.attributes)]


def test_log_reader_does_not_take_a_non_log() -> None:
    for relative in (SUMMARY, DOCQUOTE, PERF_1):
        path = vendor_fixture(relative)
        assert not ConsoleLogReader.recognises(path, read_head(path))
    assert not ConsoleLogReader.recognises(TRAIN_STEP, read_head(TRAIN_STEP))


def test_truncated_step_record_names_its_line(tmp_path: Path) -> None:
    lines = vendor_fixture(BERT_512).read_text().splitlines()
    lines[80] = "2024-04-08 04:37:02,444 INFO:   | Train Device=CSX, Step=800, Loss=7.27344, Rate=17"
    log = tmp_path / "run.log"
    log.write_text("\n".join(lines[:81]) + "\n")
    # The truncated record is a problem of its line; the 79 lines before it still count.
    recovery = ConsoleLogReader(log).read()
    assert [m.step for m in measurements(recovery, "train.loss")] == [100, 200, 300, 400, 500, 600, 700]
    account = recovery.sources[0].lines
    assert account is not None and account.total == 81
    assert (81, "step record without Step, Loss, Rate and GlobalRate") in account.problems


# -- JSON reports and the compile report ------------------------------------------------


@dataclass(frozen=True)
class ReportCase:
    fixture: str
    reader: type
    #: measurement name → value
    values: dict[str, float]
    attributes: dict[str, Any] = field(default_factory=dict)


REPORT_CASES = [
    ReportCase(
        PERF_1,
        PerformanceJsonReader,
        {
            "flops_utilization": 0.0008457,
            "global_rate": 233.45426747122673,
            "rate": 2635.2636322886055,
            "samples_per_sec": 233.45426747122673,
            "total_samples": 81920.0,
            "total_time": 351.033220242,
        },
        {"performance": {"executor": "000001", "run_dir": "20260919_033144"}},
    ),
    ReportCase(
        PERF_LATEST,
        PerformanceJsonReader,
        {
            "flops_utilization": 0.00118253,
            "global_rate": 799.9716829164196,
            "rate": 7541.1444110182365,
            "samples_per_sec": 799.9716829164196,
            "total_samples": 32768.0,
            "total_time": 41.012012308,
        },
        {"performance": {"executor": "latest", "run_dir": "20260919_033144"}},
    ),
    ReportCase(TRACK, TrackJsonReader, {"track.phase": 0.0189605}),
    ReportCase(
        SUMMARY,
        RunSummaryReader,
        {"run": 3277.62085},
        {  # 03:31:37.7415 → 04:26:15.36235
            "workflow_ids": ["wflow-fvz3qqvjetcg2heueuc7wr"],
            "jobs": [
                {"id": "wsjob-fgmjxnggzuwvpxuxkzxfgk", "kind": "compile", "run": 0},
                {"id": "wsjob-rxaghvojy5shc3odyexwvz", "kind": "compile", "run": 0},
                {"id": "wsjob-mcmszhnpnaxvwzyzgrvmpi", "kind": "execute", "run": 0},
            ],
        },
    ),
    ReportCase(
        DOCQUOTE,
        CompileReportReader,
        {
            "estimate.samples_per_sec": 14724.2,
            "estimate.compute_samples_per_sec": 17287.7,
            "estimate.transmission_samples_per_sec": 14724.2,
            "estimate.active_pes": 0.62,
            "estimate.compute_utilization": 0.52,
        },
        {"compile_report": {"compile_hash": None, "kernels": 0}},
    ),
]


@pytest.mark.parametrize("case", REPORT_CASES, ids=lambda case: case.fixture.rsplit("/", 2)[-2])
def test_report(case: ReportCase) -> None:
    recovery = case.reader(vendor_fixture(case.fixture)).read()
    assert {m.name: m.value for m in recovery.measurements} == case.values
    for key, expected in case.attributes.items():
        assert recovery.attributes[key] == expected


def test_run_summary_status_and_csx() -> None:
    recovery = RunSummaryReader(vendor_fixture(SUMMARY)).read()
    summary = recovery.attributes["run_summary"]
    assert (summary["status"], summary["num_csx"], summary["min_num_csx"]) == ("success", 1, 1)
    run = measurements(recovery, "run")[0]
    assert run.start_s == pytest.approx(1789788697.7415, abs=1e-6)  # 2026-09-19 03:31:37.741500 UTC
    assert run.attributes["status"] == "success"


def test_docquote_compile_report_units() -> None:
    recovery = CompileReportReader(vendor_fixture(DOCQUOTE)).read()
    active = measurements(recovery, "estimate.active_pes")[0]
    assert (active.unit, active.attributes["text"], active.origin.rsplit(":", 1)[1]) == (
        "fraction",
        "62%",
        "6",
    )
    assert measurements(recovery, "estimate.samples_per_sec")[0].unit == "samples/s"
    assert recovery.partitions == ()


def test_synthetic_compile_report_kernels() -> None:
    recovery = CompileReportReader(TRAIN_REPORT).read()
    assert {m.name: m.value for m in recovery.measurements} == {
        "estimate.samples_per_sec": 14724.2,
        "estimate.compute_samples_per_sec": 15102.3,
        "estimate.transmission_samples_per_sec": 14724.2,
        "estimate.active_pes": 0.81,
        "estimate.compute_utilization": 0.67,
    }
    kernels = {p.attributes["name"]: p for p in recovery.partitions}
    assert len(kernels) == 25 and {p.kind for p in recovery.partitions} == {"kernel"}
    dense = kernels["bert.encoder.layer.3.intermediate.dense.fc"]
    assert dense.id == "cs_4471189405126833117/kernel/bert.encoder.layer.3.intermediate.dense.fc"
    assert (
        dense.attributes["compute_samples_per_sec"],
        dense.attributes["active_pes"],
        dense.attributes["compute_utilization"],
    ) == (16950.2, 43008, 0.91)


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ('{\n    "flops_utilization": 0.1,\n    "global_rate": ,\n    "rate": 2.0\n}\n', 3, "not valid JSON"),
        (
            '{\n    "flops_utilization": 0.1,\n    "total_time": "41 s"\n}\n',
            3,
            "total_time: expected a number",
        ),
        ('{\n    "flops_utilization": 0.1,\n    "global_rate": 7', 3, "not valid JSON"),
    ],
)
def test_corrupt_performance_json_names_file_and_line(
    tmp_path: Path, text: str, line: int, message: str
) -> None:
    path = tmp_path / "performance.json"  # synthetic
    path.write_text(text)
    assert PerformanceJsonReader.recognises(path, read_head(path))
    with pytest.raises(ArtifactError, match=rf"performance\.json:{line}: {message}"):
        PerformanceJsonReader(path).read()


def test_kernel_row_with_missing_cells_names_its_line(tmp_path: Path) -> None:
    lines = TRAIN_REPORT.read_text().splitlines()
    lines[14] = "| bert.encoder.layer.3.attention.self.value.fc | 14724.2 | 17301.9 |"
    path = tmp_path / "compile_report.txt"
    path.write_text("\n".join(lines) + "\n")
    recovery = CompileReportReader(path).read()
    whole = CompileReportReader(TRAIN_REPORT).read()
    # The short row is a problem of line 15; every other kernel is still read.
    assert len(recovery.partitions) == len(whole.partitions) - 1
    account = recovery.sources[0].lines
    assert account is not None and account.unparsed == 1
    assert account.problems == ((15, "kernel row has 3 cells, the header 6"),)


# -- CIRH -------------------------------------------------------------------------------


def phases(recovery: Recovery) -> dict[str | None, int]:
    counts: dict[str | None, int] = {}
    for op in recovery.operators:
        counts[op.phase] = counts.get(op.phase, 0) + 1
    return counts


@dataclass(frozen=True)
class OpCase:
    id: str
    expected: dict[str, Any]


TRAIN_STEP_OPS = [
    OpCase(
        "train_step/cirh.MatMul#0",
        {
            "op": "cirh.MatMul",
            "phase": "forward",
            "name": "bert.encoder.layer.3.attention.self.query",
            "module_path": ("bert", "encoder", "layer", "3", "attention", "self", "query"),
            "source": SourceLoc("torch/nn/modules/linear.py", 116, 0),
            "macs": 512 * 128 * 1024 * 1024,
            "partition": "cs_4471189405126833117/kernel/bert.encoder.layer.3.attention.self.query.fc",
            "shapes": [(512, 128, 1024), (1024, 1024), (512, 128, 1024)],
        },
    ),
    OpCase(
        "train_step/cirh.MatMul#3",
        {  # the attention scores, a batched matmul
            "op": "cirh.MatMul",
            "phase": "forward",
            "macs": 512 * 16 * 128 * 128 * 64,
            "module_path": ("bert", "encoder", "layer", "3", "attention", "self"),
        },
    ),
    OpCase(
        "train_step/cirh.Softmax#0",
        {
            "phase": "forward",
            "source": SourceLoc("torch/nn/functional.py", 1843, 0),
            "call_stack": (
                SourceLoc("torch/nn/functional.py", 1843, 0),
                SourceLoc("transformers/models/bert/modeling_bert.py", 326, 0),
            ),
            "macs": None,
        },
    ),
    OpCase("train_step/cirh.Transpose#0", {"phase": None, "module_path": (), "source": None}),
    # Backward by op name: the location is the forward op's.
    OpCase(
        "train_step/cirh.MatMulGrad#0",
        {
            "phase": "backward",
            "module_path": ("bert", "encoder", "layer", "3", "output", "dense"),
            "shapes": [(512, 128, 1024), (512, 128, 4096), (4096, 1024), (512, 128, 4096), (4096, 1024)],
        },
    ),
    # Backward by location: an autograd frame, an op name that says nothing.
    OpCase(
        "train_step/cirh.Add#2",
        {"phase": "backward", "source": SourceLoc("torch/autograd/__init__.py", 266, 0)},
    ),
    OpCase(
        "train_step/cirh.AdamUpdate#0",
        {
            "phase": "optimizer",
            "module_path": ("bert", "encoder", "layer", "3", "attention", "self", "query"),
            "source": SourceLoc("cerebras/pytorch/optim/AdamW.py", 178, 0),
            "partition": "cs_4471189405126833117/kernel/optimizer.adamw",
        },
    ),
    # Optimizer by op name: an unknown location.
    OpCase("train_step/cirh.AdamUpdate#5", {"phase": "optimizer", "module_path": (), "source": None}),
]


def op_facts(op: Any) -> dict[str, Any]:
    return {
        "op": op.op,
        "phase": op.phase,
        "name": op.name,
        "module_path": op.module_path,
        "source": op.source,
        "macs": op.macs,
        "partition": op.partition,
        "call_stack": op.call_stack,
        "shapes": [value.shape for value in (*op.inputs, *op.outputs)],
    }


@pytest.fixture(scope="module")
def train_step() -> Recovery:
    return CirhReader(TRAIN_STEP).read()


def test_train_step_ops_by_phase(train_step: Recovery) -> None:
    assert train_step.sources[0].parser == "mlir-bindings"
    assert len(train_step.operators) == 43
    assert phases(train_step) == {"forward": 17, "backward": 13, "optimizer": 8, None: 5}
    assert train_step.attributes["cirh"]["functions"] == {"train_step": 43}


@pytest.mark.parametrize("case", TRAIN_STEP_OPS, ids=lambda case: case.id)
def test_train_step_op(train_step: Recovery, case: OpCase) -> None:
    op = next(op for op in train_step.operators if op.id == case.id)
    facts = op_facts(op)
    assert {key: facts[key] for key in case.expected} == case.expected


def test_train_step_tensors(train_step: Recovery) -> None:
    tensors = {tensor.id: tensor for tensor in train_step.tensors}
    assert len(tensors) == 63
    # Parameters are the arguments the optimizer updates.
    assert sorted(t.name for t in tensors.values() if t.constant) == sorted(
        f"bert.encoder.layer.3.{suffix}"
        for suffix in (
            "attention.self.query.weight",
            "attention.self.key.weight",
            "attention.self.value.weight",
            "attention.output.dense.weight",
            "attention.output.LayerNorm.weight",
            "attention.output.LayerNorm.bias",
            "intermediate.dense.weight",
            "output.dense.weight",
        )
    )
    query = tensors["train_step/cirh.MatMul#0:0"]
    assert (query.producer, query.consumers, query.bytes) == (
        "train_step/cirh.MatMul#0",
        ("train_step/cirh.Reshape#0",),
        512 * 128 * 1024 * 2,
    )
    kernels = {p.attributes["name"]: p.operator_ids for p in train_step.partitions}
    assert len(kernels["optimizer.adamw"]) == 8


def test_line_reader_and_mlir_parser_give_the_same_operators() -> None:
    parsed = CirhReader(TRAIN_STEP, parser="mlir-bindings").read()
    lines = CirhReader(TRAIN_STEP, parser="line-reader").read()
    assert lines.sources[0].parser == "line-reader"
    assert lines.operators == parsed.operators
    assert lines.tensors == parsed.tensors
    assert lines.partitions == parsed.partitions


def test_dump_the_parser_rejects_falls_back_to_the_line_reader() -> None:
    recovery = CirhReader(CUSTOM_ASSEMBLY).read()
    assert recovery.sources[0].parser == "line-reader"
    assert "custom op 'cirh.Tanh'" in recovery.attributes["cirh"]["parser_fallback"]
    assert f"{CUSTOM_ASSEMBLY}:6:10" in recovery.attributes["cirh"]["parser_fallback"]
    assert [op.id for op in recovery.operators] == [
        "forward/cirh.Slice#0",
        "forward/cirh.MatMul#0",
        "forward/cirh.Tanh#0",
        "forward/cirh.MatMul#1",
        "forward/cirh.Softmax#0",
    ]
    assert phases(recovery) == {"forward": 5}
    tanh = recovery.operators[2]  # custom assembly: operand type from its producer
    assert (tanh.module_path, tanh.inputs[0].shape, tanh.outputs[0].shape) == (
        ("bert", "pooler", "activation"),
        (512, 1024),
        (512, 1024),
    )
    assert tanh.source == SourceLoc("transformers/models/bert/modeling_bert.py", 662, 0)
    softmax = recovery.operators[4]  # an inline call-site location, no alias
    assert (softmax.module_path, softmax.attributes["dim"]) == (("cls",), "-1 : i64")
    assert [c.status for c in recovery.coverage if c.aspect == "compiler_ir"] == [Coverage.PARTIAL]


def test_large_dumps_go_to_the_line_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cirh_module, "BINDINGS_MAX_BYTES", 1000)
    recovery = CirhReader(TRAIN_STEP).read()
    assert recovery.sources[0].parser == "line-reader"
    assert "parser_choice" in recovery.attributes["cirh"]


@pytest.mark.parametrize(
    ("old", "new", "line", "message"),
    [
        ('%12 = "cirh.LayerNorm"(%11,', '%12 = "cirh.LayerNorm"(%99,', 26, "operand %99 is not defined"),
        ("loc(#loc63)\n    %16", "loc(#loc999)\n    %16", 29, "location alias #loc999 is not defined"),
        (
            ": (tensor<512x128x1024xbf16>) -> tensor<512x16x128x64xbf16> loc(#loc40)\n    %4",
            "loc(#loc40)\n    %4",
            17,
            "cirh.Reshape: no type signature",
        ),
    ],
)
def test_line_reader_errors_name_the_line(
    tmp_path: Path, old: str, new: str, line: int, message: str
) -> None:
    text = TRAIN_STEP.read_text()
    assert old in text
    path = tmp_path / "cirh.mlir"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(ArtifactError, match=rf"cirh\.mlir:{line}: .*{message}"):
        CirhReader(path).read()  # rejected by the parser, then by the line reader


# -- reconstruct ------------------------------------------------------------------------


def test_reconstruct_joins_log_compile_dir_cirh_and_report(tmp_path: Path) -> None:
    shutil.copy(vendor_fixture(BERT_512), tmp_path / "mytest.log")
    shutil.copytree(TRAIN_STEP.parent, tmp_path / "cs_8939750200954608837")  # the log's compile hash
    (tmp_path / "notes.txt").write_text("not an artifact\n")
    recovery = reconstruct([tmp_path])
    assert recovery.attributes["ignored_files"] == [str(tmp_path / "notes.txt")]
    assert len(recovery.operators) == 43
    compile_ = measurements(recovery, "compile")[0]
    assert compile_.ids == tuple(op.id for op in recovery.operators)
    joins = {join["join"]: join for join in recovery.attributes["joins"]}
    assert joins["log compile hash = compile directory"]["operators"] == 43
    assert joins["cirh cs.kernel = compile_report kernel row"]["kernels"] == 24
    kernels = {p.attributes["name"]: p for p in recovery.partitions}
    query = kernels["bert.encoder.layer.3.attention.self.query.fc"]
    assert (query.operator_ids, query.attributes["compute_samples_per_sec"]) == (
        ("train_step/cirh.MatMul#0",),
        17287.7,
    )
    assert kernels["loss.grad"].operator_ids and "samples_per_sec" not in kernels["loss.grad"].attributes
    assert not kernels["bert.encoder.layer.3.output.LayerNorm"].operator_ids
    coverage = {note.aspect: note.status for note in recovery.coverage}
    assert coverage["per_op_timing"] is Coverage.NOT_EXPOSED
    assert coverage["per_program_timing"] is Coverage.PARTIAL
    assert coverage["compiler_ir"] is Coverage.RECOVERED
    assert coverage["lineage"] is Coverage.PARTIAL  # 9 ops without a module path, 5 without a phase


def test_reconstruct_joins_summary_runs_to_executor_reports() -> None:
    recovery = reconstruct([vendor_fixture(JSON_DIR)])
    perf = [m for m in recovery.measurements if m.name == "total_time"]
    assert {
        (m.attributes["executor"], m.attributes["status"], m.attributes["workflow_id"]) for m in perf
    } == {
        ("000001", "success", "wflow-fvz3qqvjetcg2heueuc7wr"),
        ("latest", "success", "wflow-fvz3qqvjetcg2heueuc7wr"),
    }
    assert recovery.attributes["joins"] == [
        {"join": "summary.json artifact_dir = cerebras_logs/<run>", "measurements": 13}
    ]
    assert {note.aspect: note.status for note in recovery.coverage}["compiler_ir"] is Coverage.NOT_EXPOSED


def test_reconstruct_keeps_op_ids_unique_across_dumps(tmp_path: Path) -> None:
    for name in ("cs_1", "cs_2"):
        (tmp_path / name).mkdir()
        shutil.copy(TRAIN_STEP, tmp_path / name / "cirh.mlir")
    recovery = reconstruct([tmp_path])
    ids = [op.id for op in recovery.operators]
    assert len(ids) == len(set(ids)) == 86
    assert "cs_2/cirh/train_step/cirh.MatMul#0" in ids


def test_capabilities() -> None:
    descriptor = cerebras.capabilities()
    assert (descriptor["backend"], descriptor["path"]) == ("cerebras", "reconstruction")
    assert set(descriptor["exposes"]) == set(ASPECTS)
    assert descriptor["exposes"]["per_op_timing"] == "none"


def test_both_parsers_read_the_generic_form(tmp_path: Path) -> None:
    """The same train step printed in generic form (``"func.func"() <{...}> ({ ^bb0(...)``),
    as a dump written with ``--mlir-print-op-generic`` would be."""
    from iree.compiler import ir

    context = ir.Context()
    context.allow_unregistered_dialects = True
    with context:
        module = ir.Module.parse(TRAIN_STEP.read_text())
        text = module.operation.get_asm(print_generic_op_form=True, enable_debug_info=True)
    del module, context
    path = tmp_path / "cs_4471189405126833117" / "cirh_generic.mlir"
    path.parent.mkdir()
    path.write_text(text)
    expected = CirhReader(TRAIN_STEP).read()
    for parser in ("mlir-bindings", "line-reader"):
        recovery = CirhReader(path, parser=parser).read()
        assert recovery.operators == expected.operators, parser
        assert recovery.tensors == expected.tensors, parser


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('cs.kernel = "a.b", dim = -1 : i64', {"cs.kernel": "a.b", "dim": "-1 : i64"}),
        ("perm = array<i64: 0, 2, 3, 1>", {"perm": "array<i64: 0, 2, 3, 1>"}),
        ('name = "x, y = z", flag', {"name": "x, y = z", "flag": "unit"}),
        ('"quoted key" = "say \\"hi\\""', {"quoted key": 'say "hi"'}),
        ("", {}),
    ],
)
def test_attribute_dictionary_text(text: str, expected: dict[str, str]) -> None:
    assert cirh_module.parse_attribute_dict(text) == expected


def test_every_input_together() -> None:
    recovery = reconstruct([vendor_fixture("cerebras"), INPUTS])
    assert recovery.attributes["ignored_files"] == []
    assert len(recovery.sources) == len(FIXTURE_READERS) + 3
    ids = [op.id for op in recovery.operators]
    assert len(ids) == len(set(ids)) == 43 + 5


#: SYNTHETIC: an op with a region whose block has an argument, in generic form.
REGION_OP = """\
module {
  func.func @step(%arg0: tensor<4xf32> loc("x")) -> tensor<4xf32> {
    %0 = "cirh.Loop"(%arg0) ({
    ^bb0(%arg1: tensor<4xf32> loc("carry")):
      %2 = "cirh.Add"(%arg1, %arg1) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32> loc(#loc1)
      "cirh.Yield"(%2) : (tensor<4xf32>) -> () loc(#loc)
    }) {trip = 3 : i64} : (tensor<4xf32>) -> tensor<4xf32> loc("m.loop"("a.py":2:1))
    %1 = "cirh.Relu"(%0) : (tensor<4xf32>) -> tensor<4xf32> loc(unknown)
    return %1 : tensor<4xf32> loc(#loc)
  } loc(#loc)
} loc(#loc)
#loc = loc(unknown)
#loc1 = loc("m.loop"("a.py":3:1))
"""


def test_both_parsers_read_ops_with_regions(tmp_path: Path) -> None:
    path = tmp_path / "cirh.mlir"
    path.write_text(REGION_OP)
    parsed = CirhReader(path, parser="mlir-bindings").read()
    lines = CirhReader(path, parser="line-reader").read()
    assert [op.id for op in parsed.operators] == [
        "step/cirh.Loop#0",
        "step/cirh.Add#0",
        "step/cirh.Yield#0",
        "step/cirh.Relu#0",
    ]
    assert lines.operators == parsed.operators
    assert sorted(lines.tensors, key=lambda t: t.id) == sorted(parsed.tensors, key=lambda t: t.id)
    carry = next(t for t in parsed.tensors if t.id == "step/cirh.Loop#0/bb0/arg0")
    assert (carry.name, carry.consumers) == ("carry", ("step/cirh.Add#0", "step/cirh.Add#0"))


def test_reconstruct_links_a_log_and_a_summary_by_their_ids(tmp_path: Path) -> None:
    """The fixtures' log and summary.json come from different runs; a summary.json
    rewritten (synthetic) to name the products log's workflow and execute job joins it."""
    shutil.copy(vendor_fixture(PRODUCTS), tmp_path / "run.log")
    summary = json.loads(vendor_fixture(SUMMARY).read_text())
    summary["workflow_id"] = "wflow-qvfu4smtpmmndcmvud3xbw"
    summary["runs"][0]["execute_job_ids"] = ["wsjob-hnorg22m63suqup4sf3t88"]
    (tmp_path / "20260131_084013_restartable").mkdir()
    (tmp_path / "20260131_084013_restartable" / "summary.json").write_text(json.dumps(summary, indent=4))
    joins = reconstruct([tmp_path]).attributes["joins"]
    assert [(join["join"], join["ids"]) for join in joins] == [
        ("wsjob id", ["wsjob-hnorg22m63suqup4sf3t88"]),
        ("workflow id", ["wflow-qvfu4smtpmmndcmvud3xbw"]),
    ]
