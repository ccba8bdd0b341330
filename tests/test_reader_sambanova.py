"""SambaNova reconstruction readers, on the real logs in ../shared/fixtures/sambanova.

Every expected value below was read off the fixture files by hand (grep / an editor):
line numbers, counts and figures are the files', not the readers'. Synthetic inputs
(files named ``synthetic_*``) appear only in two edge-case tests and the error-path table
at the end, and are labelled there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from dfit_mlir.adapters.base import ASPECTS
from dfit_mlir.adapters.recovery import ArtifactError, Coverage, Recovery, read_head
from dfit_mlir.adapters.sambanova import (
    READERS,
    PyinstrumentProfileReader,
    SambaFlowCompileLogReader,
    SambaFlowRunLogReader,
    SambaTuneLogReader,
    capabilities,
    reconstruct,
)
from dfit_mlir.adapters.sambanova.compile_log import split_operator_name
from tests.conftest import VENDOR_FIXTURES, vendor_fixture

COMPILE_117 = "sambanova/bertlarge_compile_sf1.17.7_sn30/BertLarge_HW_compile_log_base.out"
COMPILE_119 = "sambanova/bertlarge_compile_sf1.19.1_sn30/BertLarge.out"
RUN_DP8 = "sambanova/bertlarge_run_dp8_sf1.17.7_sn30/BertLarge.out"
SLURM_2021 = "sambanova/ffn_mnist_dataparallel_2021/slurm.out"
VIT_FAILURE = "sambanova/vit_compile_failure_sn30_2023/error.log"
SAMBATUNE = "sambanova/sambatune_uno_sn10_2022/ccle_09_19_22_11_50.log"
PYINSTRUMENT = "sambanova/pyinstrument_uno_sn10_2022/tmpeo5ehksn.profileSession.json"

COMPILE = SambaFlowCompileLogReader.format
RUN = SambaFlowRunLogReader.format
TUNE = SambaTuneLogReader.format
PROFILE = PyinstrumentProfileReader.format
READER_OF = {reader.format: reader for reader in READERS}


@cache
def read(relative: str, fmt: str) -> Recovery:
    return READER_OF[fmt](vendor_fixture(relative)).read()


def measurement(recovery: Recovery, name: str, **where: Any) -> Any:
    found = [
        m
        for m in recovery.measurements
        if m.name == name and all(getattr(m, k) == v for k, v in where.items())
    ]
    assert len(found) == 1, (name, where, len(found))
    return found[0]


# --- every file: recognised by the right readers, read without error -----------------

#: fixture → (formats that recognise it, formats that find records in it). Job-script
#: logs start with the same header whether they hold a compile or a run, so both console
#: readers recognise them; only one finds its kind of output (the 2021 SLURM output holds
#: a compile and a run).
FILES = {
    COMPILE_117: ({COMPILE, RUN}, {COMPILE}),
    COMPILE_119: ({COMPILE, RUN}, {COMPILE}),
    RUN_DP8: ({COMPILE, RUN}, {RUN}),
    SLURM_2021: ({COMPILE, RUN}, {COMPILE, RUN}),
    VIT_FAILURE: ({COMPILE}, {COMPILE}),
    SAMBATUNE: ({TUNE}, {TUNE}),
    PYINSTRUMENT: ({PROFILE}, {PROFILE}),
}


def test_the_table_lists_every_sambanova_fixture() -> None:
    folder = VENDOR_FIXTURES / "sambanova"
    if not folder.is_dir():
        pytest.skip(f"{folder} is absent")
    on_disk = {f"sambanova/{p.relative_to(folder)}" for p in folder.rglob("*") if p.is_file()}
    assert on_disk == set(FILES)


@pytest.mark.parametrize(
    ("relative", "expected"), FILES.items(), ids=[key.split("/")[1] for key in FILES]
)
def test_every_file_is_recognised_and_read(
    relative: str, expected: tuple[set[str], set[str]]
) -> None:
    path = vendor_fixture(relative)
    recognising, holding = expected
    head = read_head(path)
    assert {r.format for r in READERS if r.recognises(path, head)} == recognising
    found = set()
    for fmt in recognising:
        recovery = read(relative, fmt)
        assert recovery.backend == "sambanova"
        assert [s.format for s in recovery.sources] == [fmt]
        # A compile reader on a job log without compile output keeps only the job's
        # facts (``job_script_only``), used when no other reader finds more.
        if (
            recovery.operators
            or recovery.partitions
            or recovery.measurements
            or recovery.attributes
        ) and not recovery.attributes.get("job_script_only"):
            found.add(fmt)
    assert found == holding


# --- compile logs ------------------------------------------------------------------


@dataclass(frozen=True)
class CompileCase:
    fixture: str
    status: str
    attributes: dict[str, Any]
    partitions: int = 0
    #: Plasma unit → (first, last) partition index.
    sections: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: measurement name → value (seconds, FLOP/s, B/s after conversion).
    figures: dict[str, float] = field(default_factory=dict)
    operators: int = 0
    shaped_operators: int = 0
    #: operator name → partition ID, matched through rail's buffer-context names.
    placed: dict[str, str] = field(default_factory=dict)


BERT = "bertformaskedlm__"
COMPILE_CASES = [
    CompileCase(
        fixture=COMPILE_117,
        status="succeeded",
        attributes={
            "sambaflow_version": "1.17.7-27",
            "platform": "DataScale SN30-8",
            "model": "BertLarge",
            "graph": "hf_transformer_samba",
            "pef_path": "/home/datascientist38/BertLarge/bertlrg//bertlrg.pef",
            "pef_line": 1522,
            "pef_name": "bertlrg",
            "submitted_batch_job": 30451,
            "runtime_log_ids": ["[datascientist38][python][2734725]"],
            "section_boundaries": [
                "fwd_section_boundaries",
                "bwd_section_boundaries",
                "opt_section_boundaries",
                "fwd_naming_boundaries",
                "bwd_naming_boundaries",
            ],
        },
        partitions=72,
        sections={"sections_0_31": (0, 31), "sections_32_63": (32, 63), "sections_64_71": (64, 71)},
        figures={
            "amortized.pcus": 450.0,
            "amortized.pmus": 689.0,
            "amortized.projected_latency": 0.6079219,
            "amortized.projected_flop_rate": 121.6469e12,
            "amortized.projected_ddr_bandwidth": 64.63480e9,
            "compile.duration": 780.0,  # COMPILE START AT 0 .. COMPILE END AT 780
            "job_script.duration": 781.0,  # Duration:  781
            "compile.phase": 772.403,  # NLP app started 04:26:33,240 .. finished 04:39:25,643
        },
        operators=93,  # 88 'for op' NamedTensor warnings + air.Embedding + 4 decoder gemm shards
        shaped_operators=89,
        placed={
            f"{BERT}crossentropyloss_1": "partition_7_0",
            f"{BERT}cls__predictions__decoder__linear__gemm__0_bwd_weight_accum": "partition_9_0",
            f"{BERT}cls__predictions__decoder__linear__gemm__3_bwd_weight_accum": "partition_9_0",
        },
    ),
    CompileCase(
        fixture=COMPILE_119,
        status="succeeded",
        attributes={
            "sambaflow_version": "1.19.1-44",
            "pef_path": "/home/kevinfang/BertLarge/bertlrg//bertlrg.pef",
            "pef_name": "bertlrg",
            "runtime_log_ids": ["[kevinfang][python][841013]"],
        },
        partitions=75,
        sections={"sections_0_31": (0, 31), "sections_32_63": (32, 63), "sections_64_74": (64, 74)},
        figures={
            "amortized.pcus": 449.0,
            "amortized.pmus": 702.0,
            "amortized.projected_latency": 0.6059891,
            "amortized.projected_flop_rate": 122.0349e12,
            "amortized.projected_ddr_bandwidth": 64.84095e9,
            "compile.duration": 597.0,  # COMPILE START AT 1 .. COMPILE END AT 598
            "job_script.duration": 599.0,  # Duration:  599
            "compile.phase": 589.117,  # 07:57:19,155 .. 08:07:08,272
        },
        operators=94,  # as 1.17.7, plus crossentropyloss_bwd_loss named in partition 9's buffers
        shaped_operators=89,
        placed={
            f"{BERT}crossentropyloss_1": "partition_7_0",
            f"{BERT}crossentropyloss_1_bwd_loss": "partition_8_0",
            f"{BERT}crossentropyloss_bwd_loss": "partition_9_0",
        },
    ),
    CompileCase(
        fixture=SLURM_2021,
        status="succeeded",
        attributes={
            "pef_path": "/lambda_stor/homes/wilsonb/sambanova_starter/pef/sn_boilerplate//sn_boilerplate.pef",
            "pef_name": "sn_boilerplate",
            "compiler_log_files": [
                "pef/sn_boilerplate/sn_boilerplate.samba.log",
                "pef/sn_boilerplate/sn_boilerplate.mac.log",
            ],
            "milestones": ["Compilation succeeded"],
        },
    ),
    CompileCase(
        fixture=VIT_FAILURE,
        status="failed",
        attributes={
            "command": "python huggingface_sambanova.py compile",
            "host": "sn30-r1-h1",
            "experimental_operators": ["conv2d", "layer_norm", "mul"],
            "runtime_log_ids": ["[ghoshb][python][2372664]"],
        },
        operators=1,
    ),
]


@pytest.mark.parametrize("case", COMPILE_CASES, ids=lambda c: c.fixture.split("/")[1])
def test_compile_log(case: CompileCase) -> None:
    recovery = read(case.fixture, COMPILE)
    assert recovery.attributes["compile_status"] == case.status
    for key, value in case.attributes.items():
        assert recovery.attributes[key] == value, key

    partitions = [p for p in recovery.partitions if p.kind == "partition"]
    assert len(partitions) == case.partitions
    assert [p.attributes["index"] for p in partitions] == list(range(case.partitions))
    assert all(p.attributes["status"] == "succeeded" for p in partitions)
    sections = {
        p.id: (p.attributes["first"], p.attributes["last"])
        for p in recovery.partitions
        if p.kind == "section"
    }
    assert sections == case.sections

    for name, value in case.figures.items():
        assert measurement(recovery, name).value == pytest.approx(value, rel=1e-9, abs=1e-6), name
    for estimate in (m for m in recovery.measurements if m.name.startswith("amortized.")):
        assert estimate.attributes["estimate"] is True

    assert len(recovery.operators) == case.operators
    assert sum(1 for o in recovery.operators if o.inputs or o.outputs) == case.shaped_operators
    assert len({o.id for o in recovery.operators}) == len(recovery.operators)
    by_name = {o.name: o for o in recovery.operators}
    members = {p.id: set(p.operator_ids) for p in recovery.partitions}
    for name, partition in case.placed.items():
        assert by_name[name].partition == partition
        assert by_name[name].id in members[partition]


def test_amortized_figures_keep_their_text_and_units() -> None:
    recovery = read(COMPILE_117, COMPILE)
    flops = measurement(recovery, "amortized.projected_flop_rate")
    assert (flops.unit, flops.attributes["text"]) == ("FLOP/s", "1.216469e+02 T/s")
    ddr = measurement(recovery, "amortized.projected_ddr_bandwidth")
    assert (ddr.unit, ddr.attributes["text"], ddr.origin) == (
        "B/s",
        "6.463480e+01 GB/s",
        f"{vendor_fixture(COMPILE_117)}:664",
    )


@dataclass(frozen=True)
class OperatorCase:
    fixture: str
    id: str
    op: str
    name: str | None
    module_path: tuple[str, ...]
    phase: str | None
    inputs: tuple[tuple[tuple[int, ...], str | None], ...]
    outputs: tuple[tuple[tuple[int, ...], str | None], ...]
    index: int


OPERATOR_CASES = [
    # line 477-479 of the 1.17.7 log
    OperatorCase(
        fixture=COMPILE_117,
        id="graph/linear#20",  # 27th "for op" warning, the 21st of type linear
        op="sambanova.linear",
        name=f"{BERT}bert__encoder__layer__3__attention__self__key__linear_t_output0_fused_reshape_bwd",
        module_path=("bert", "encoder", "layer", "3", "attention", "self", "key"),
        phase="backward",
        inputs=(((16, 64, 128), None),),
        outputs=(((1024, 128), None),),
        index=477,
    ),
    # line 402-404
    OperatorCase(
        fixture=COMPILE_117,
        id="graph/linear#1",
        op="sambanova.linear",
        name=f"{BERT}bert__pooler__dense__linear",
        module_path=("bert", "pooler", "dense"),
        phase="forward",
        inputs=(((1024, 1024), None), ((1024, 256), None), ((1024, 1), None)),
        outputs=(((1024, 256), None),),
        index=402,
    ),
    # line 392: the DimensionMapping warning carries typed tensors but no op name
    OperatorCase(
        fixture=COMPILE_119,
        id="graph/air.Embedding#0",
        op="sambanova.air.Embedding",
        name=None,
        module_path=(),
        phase=None,
        inputs=(((2, 1024), "bf16"), ((256, 128), "i32")),
        outputs=(((256, 128, 1024), "bf16"),),
        index=333,
    ),
]


@pytest.mark.parametrize("case", OPERATOR_CASES, ids=lambda c: c.id)
def test_operator(case: OperatorCase) -> None:
    operator = next(o for o in read(case.fixture, COMPILE).operators if o.id == case.id)
    assert (operator.op, operator.name, operator.module_path, operator.phase, operator.index) == (
        case.op,
        case.name,
        case.module_path,
        case.phase,
        case.index,
    )
    assert tuple((v.shape, v.dtype) for v in operator.inputs) == case.inputs
    assert tuple((v.shape, v.dtype) for v in operator.outputs) == case.outputs


@pytest.mark.parametrize(
    ("name", "module_path", "op_type"),
    [
        (
            f"{BERT}bert__pooler__activation__tanh",
            ("bertformaskedlm", "bert", "pooler", "activation"),
            "tanh",
        ),
        (f"{BERT}crossentropyloss_1_bwd_loss", ("bertformaskedlm",), "crossentropyloss"),
        # digit segments after the op number its shards; before it they index a ModuleList
        (
            f"{BERT}cls__predictions__decoder__linear__gemm__2_bwd_weight_accum",
            ("bertformaskedlm", "cls", "predictions", "decoder", "linear"),
            "gemm",
        ),
        (
            f"{BERT}bert__encoder__layer__0__attention__self__query__linear_t_output0_fused_reshape_bwd",
            ("bertformaskedlm", "bert", "encoder", "layer", "0", "attention", "self", "query"),
            "linear",
        ),
    ],
)
def test_operator_name_encodes_the_module_path(
    name: str, module_path: tuple[str, ...], op_type: str
) -> None:
    path, _, kind = split_operator_name(name)
    assert (path, kind) == (module_path, op_type)


def test_failed_compile_recovers_the_failure_and_the_model_line() -> None:
    recovery = read(VIT_FAILURE, COMPILE)
    failure = recovery.attributes["compile_failure"]
    assert failure["exception"] == "RuntimeError"
    assert failure["message"] == (
        "The size of tensor a (12) must match the size of tensor b (14) at non-singleton dimension 1"
    )
    assert failure["lines"] == [445, 487]
    (operator,) = recovery.operators
    assert (operator.id, operator.op, operator.status) == (
        "graph/mul#0",
        "sambanova.mul",
        "compile failed",
    )
    assert operator.source is not None
    assert operator.source.file.endswith("transformers/models/vit/modeling_vit.py")
    assert operator.source.line == 232
    assert operator.attributes["code"] == "attention_probs = attention_probs * head_mask"
    assert operator.attributes["experimental"] is True
    assert any(n.aspect == "compile" and n.status is Coverage.PARTIAL for n in recovery.coverage)


# --- run logs ------------------------------------------------------------------------


def test_data_parallel_run_log() -> None:
    recovery = read(RUN_DP8, RUN)
    losses = [m for m in recovery.measurements if m.name == "loss"]
    assert [m.step for m in losses] == list(range(1, 506))
    assert (losses[0].value, losses[-1].value) == (11.18162, 8.23795)
    assert losses[-1].origin == f"{vendor_fixture(RUN_DP8)}:972"
    assert losses[-1].attributes["pid"] == 3613047
    assert losses[-1].attributes["step_mlm_loss"] == 7.62584
    times = [m for m in recovery.measurements if m.name == "step_time"]
    assert [m.step for m in times] == list(range(1, 505))  # bar "1/2549 ... 4.25s/it" .. "504/2549"
    assert (times[0].value, times[0].attributes["text"]) == (4.25, "4.25s/it")
    assert times[-1].value == pytest.approx(1 / 1.17)
    summary = {
        "e2e_train_time": (440.37738490104675, "s"),
        "training_sequences_per_second": (300611.9853991742, "sequences/s"),
        "training_samples_per_second": (2348.5311359310485, "samples/s"),
        "final_loss": (8.308877944946289, None),
    }
    for name, (value, unit) in summary.items():
        figure = measurement(recovery, name)
        assert (figure.value, figure.unit, figure.origin) == (
            value,
            unit,
            f"{vendor_fixture(RUN_DP8)}:974",
        )
    attributes = recovery.attributes
    assert attributes["logged_steps"] == 505
    assert attributes["pef_path"] == "/home/shikhararora/logs_8/BertLarge/bertlrg/bertlrg.pef"
    assert attributes["num_tasks"] == 8 and attributes["num_tasks_from"] == "SLURM_NTASKS"
    assert attributes["task_pids"] == list(range(3613047, 3613055))
    assert attributes["task_exits"] == {
        "0": "Exited with exit code 1",
        "1": "Killed",
        "2": "Killed",
        "3": "Terminated",
        "4": "Killed",
        "5": "Terminated",
        "6": "Killed",
        "7": "Killed",
    }
    assert attributes["throughput_check"] == {
        "expected_at_least": 560000.0,
        "found": 300611.9853991742,
        "passed": False,
    }
    assert attributes["run_failure"]["exception"] == "AssertionError"
    assert attributes["slurm"]["SLURM_JOB_ID"] == "30736"
    assert "ranks" not in attributes  # 1.17 lines say 'Process ID', never a rank


def test_2021_slurm_output_run_part() -> None:
    recovery = read(SLURM_2021, RUN)
    attributes = recovery.attributes
    assert attributes["pef_path"] == "pef/sn_boilerplate/sn_boilerplate.pef"
    assert attributes["pef_name"] == "sn_boilerplate"
    assert [load["pid"] for load in attributes["pef_loads"]] == [
        25140,
        25138,
        25143,
        25136,
        25137,
        25139,
        25142,
        25141,
    ]
    assert attributes["pef_loads"][0]["line"] == 27
    assert attributes["runtime_log_ids"][:2] == [
        "[wilsonb][python][25140]",
        "[wilsonb][python][25138]",
    ]
    assert len(attributes["runtime_log_ids"]) == 8
    assert attributes["runtime_log"] == "/var/log/sambaflow/runtime/sn.log"
    assert (attributes["num_tasks"], attributes["distributed_tasks_reported"]) == (8, 8)
    assert attributes["usage_errors"] == [
        {
            "program": "sn_boilerplate_main.py",
            "message": "unrecognized arguments: -ws 8",
            "count": 8,
        }
    ]
    accuracy = [m.value for m in recovery.measurements if m.name == "test_accuracy"]
    assert accuracy == [89.86, 89.09, 88.43, 89.46, 89.74, 89.23, 89.14, 89.23]
    assert (
        measurement(recovery, "test_loss", origin=f"{vendor_fixture(SLURM_2021)}:51").value
        == 0.3443
    )


# --- SambaTune and pyinstrument --------------------------------------------------------


def test_sambatune_log() -> None:
    recovery = read(SAMBATUNE, TUNE)
    attributes = recovery.attributes
    assert (attributes["config"], attributes["modes"], attributes["platform"]) == (
        "uno_brw_CCLE.yaml",
        ["benchmark", "instrument", "run"],
        "sn10",
    )
    assert attributes["host"]["brand_raw"] == "AMD EPYC 7742 64-Core Processor"
    assert attributes["host"]["MemTotal"] == "1054336368 kB"
    assert attributes["instrumentation_stages"] == [
        "metapipe_stage_cycles",
        "metapipe_stage_cycles --include-read-stall-cycles",
        "metapipe_buf_cycles",
    ]
    assert attributes["snprof_failed"] is True
    first_failure = attributes["failures"][0]
    assert (first_failure["step"], first_failure["line"]) == ("Execute Snprof", 94)
    assert first_failure["messages"][0].startswith('Run Cmd Failed: /opt/sambaflow/bin/snprof -c "')
    assert [f["step"] for f in attributes["failures"]] == [
        "Execute Snprof",
        "Run snprof by lists",
        "Run benchmarking by lists",
        "Extract and Process e2e Snprof Data",
        "Get e2e measure performance json path",
    ]
    assert len(attributes["perf_counter_reads"]) == 5
    assert [r["exception"] for r in attributes["exceptions"]] == ["FileNotFoundError"] * 3
    compiles = [m for m in recovery.measurements if m.name == "compile.duration"]
    # 17:39:36 -> 17:43:26, 17:43:26 -> 17:44:09, -> 17:44:52, -> 17:45:33
    assert [m.value for m in compiles] == [230.0, 43.0, 43.0, 41.0]
    assert compiles[0].attributes["pef_name"] == "sn10__9_19_17_39_uno_full"
    assert compiles[0].start_s == 1663609176.0  # 2022-09-19 17:39:36, year from the host Timestamp
    sessions = [m for m in recovery.measurements if m.name == "sn_create_session"]
    assert [m.attributes["pid"] for m in sessions] == [31335, 31540, 31958, 32373, 32578]
    assert measurement(recovery, "sambatune.elapsed_time").value == 504.227


def test_pyinstrument_profile() -> None:
    recovery = read(PYINSTRUMENT, PROFILE)
    session = measurement(recovery, "pyinstrument.session")
    assert (session.kind, session.value, session.start_s) == (
        "program",
        10.743367,
        1663871484.354041,
    )
    assert session.attributes["sample_count"] == 1907
    frames = [m for m in recovery.measurements if m.kind == "function"]
    assert len(frames) == 54  # 57 frames in the file, 3 of them pyinstrument's '[self]'
    run = measurement(recovery, "sambaruntime.sambaruntime.run")
    assert run.value == 1.923627
    assert (
        run.attributes["code"]
        == "/usr/local/lib/python3.7/site-packages/sambaruntime/sambaruntime.py:533"
    )
    assert run.attributes["self_time_s"] == 0.0  # all of it in _run_except_handler_wrapper
    assert run.attributes["caller"] == "apps.private.anl.uno_full.run_on_rdu"
    assert measurement(recovery, "sambaruntime.sambaruntime.set_tensors").value == 0.109842
    assert recovery.attributes["pef_name"] == "uno_16_4_500"


def test_pyinstrument_html_report_is_read_like_its_json(tmp_path: Path) -> None:
    # synthetic page around the real session: pyinstrument's HTML embeds it this way
    session = vendor_fixture(PYINSTRUMENT).read_text()
    page = tmp_path / "synthetic_profile.html"
    page.write_text(f"<html><script>\nwindow.profileSession = {session};\n</script></html>")
    assert PyinstrumentProfileReader.recognises(page, read_head(page))
    recovery = PyinstrumentProfileReader(page).read()
    assert measurement(recovery, "pyinstrument.session").value == 10.743367
    assert len(recovery.measurements) == len(read(PYINSTRUMENT, PROFILE).measurements)


def test_rank_is_kept_where_the_line_states_it(tmp_path: Path) -> None:
    # synthetic: a 1.19-style step line ('Rank r, PID n', as the 1.19.1 compile log prints)
    log = tmp_path / "synthetic_rank.out"
    log.write_text(
        "2024-11-20 08:00:00,000 - apps.trainer - Rank 3, PID 841016 - info     - "
        "epoch:0|local_step:1|step_loss:11.5\n"
    )
    recovery = SambaFlowRunLogReader(log).read()
    loss = measurement(recovery, "loss")
    assert (loss.step, loss.value, loss.attributes["rank"], loss.attributes["pid"]) == (
        1,
        11.5,
        3,
        841016,
    )
    assert recovery.attributes["ranks"] == {"841016": 3}


# --- the whole dump ------------------------------------------------------------------


def test_reconstruct_matches_compile_and_run_through_the_pef() -> None:
    compile_log, run_log = vendor_fixture(COMPILE_117), vendor_fixture(RUN_DP8)
    recovery = reconstruct([compile_log.parent, run_log, VENDOR_FIXTURES / "SOURCES.md"])
    assert [(s.path, s.format) for s in recovery.sources] == [
        (str(compile_log), COMPILE),
        (str(run_log), RUN),
    ]
    assert recovery.attributes["ignored_files"] == [str(VENDOR_FIXTURES / "SOURCES.md")]
    (match,) = recovery.attributes["pef_matches"]
    assert match["pef_name"] == "bertlrg"
    assert [a["path"] for a in match["artifacts"]] == [str(compile_log), str(run_log)]
    assert match["same_path"] is False  # /home/datascientist38/... vs /home/shikhararora/...
    assert len(recovery.partitions) == 75 and recovery.operators[0].id == "graph/air.Embedding#0"
    status = {note.aspect: note.status for note in recovery.coverage}
    assert status == {
        "compiler_ir": Coverage.NOT_EXPOSED,
        "lineage": Coverage.NOT_EXPOSED,
        "source_locations": Coverage.PARTIAL,
        "tensor_shapes": Coverage.PARTIAL,
        "operators": Coverage.PARTIAL,
        "partitions": Coverage.RECOVERED,
        "static_cost": Coverage.PARTIAL,
        "per_op_timing": Coverage.NOT_EXPOSED,
        "per_partition_timing": Coverage.NOT_EXPOSED,
        "per_program_timing": Coverage.RECOVERED,
        "memory": Coverage.NOT_EXPOSED,
        "matching": Coverage.RECOVERED,
    }


def test_reconstruct_of_every_fixture_keeps_ids_unique() -> None:
    folder = VENDOR_FIXTURES / "sambanova"
    if not folder.is_dir():
        pytest.skip(f"{folder} is absent")
    recovery = reconstruct([folder])
    assert recovery.attributes["ignored_files"] == []
    # seven files; the 2021 SLURM output is read twice, as a compile and as a run
    assert len(recovery.sources) == 8
    ids = [o.id for o in recovery.operators]
    assert len(ids) == len(set(ids)) == 93 + 94 + 1
    partition_ids = {p.id for p in recovery.partitions}
    assert len(partition_ids) == len(recovery.partitions) == 75 + 78
    assert "BertLarge_HW_compile_log_base/partition_7_0" in partition_ids
    assert all(o.partition in partition_ids for o in recovery.operators if o.partition)
    matched = {m["pef_name"]: len(m["artifacts"]) for m in recovery.attributes["pef_matches"]}
    assert matched == {"bertlrg": 3, "sn_boilerplate": 2}
    assert any(n.aspect == "compile" and "RuntimeError" in n.detail for n in recovery.coverage)


def test_capabilities_cover_every_aspect() -> None:
    descriptor = capabilities()
    assert (descriptor["backend"], descriptor["path"]) == ("sambanova", "reconstruction")
    assert set(descriptor["exposes"]) == set(ASPECTS)
    assert descriptor["exposes"]["per_op_timing"] == "none"


# --- unreadable input (synthetic files, written here) ---------------------------------

ERROR_CASES = [
    (
        "synthetic_amortized.out",
        SambaFlowCompileLogReader,
        "COMPILE START AT 0\n[info    ]: Amortized resources overall: 4.5e+02 PCUs, many PMUs, "
        "projected latency: 6.0e-01 s, FLOPS: 1.2e+02 T/s, DDR_BW: 6.4e+01 GB/s\n",
        2,
        "expected a number, found 'many'",
    ),
    (
        "synthetic_named_tensor.out",
        SambaFlowCompileLogReader,
        "[warning ]: Try to squeeze a unsqueezable dim d0 for op model__fc__linear\n"
        " inputs: {NamedTensor: shape {256, x1024} names: {d0, d1}}\n",
        2,
        "expected an integer, found 'x1024'",
    ),
    (
        "synthetic_compile_end.out",
        SambaFlowCompileLogReader,
        "COMPILE START AT 0\nCOMPILE END AT soon\n",
        2,
        "expected an integer",
    ),
    (
        "synthetic_step.out",
        SambaFlowRunLogReader,
        "RUN COMMAND: srun python app.py run --pef=out/a/a.pef\n"
        "2024-04-07 09:58:11,226 - trainer - Process ID 7 - info     - epoch:0|local_step:3|step_loss:9.x1\n",
        2,
        "step_loss: expected a number",
    ),
    (
        "synthetic_summary.out",
        SambaFlowRunLogReader,
        "RUN COMMAND: srun python app.py run\n\n"
        "2024-04-07 10:05:24,192 - trainer - Process ID 7 - info     - {'e2e_train_time': 440.3, 'x': }\n",
        3,
        "unreadable summary dictionary",
    ),
    (
        "synthetic_sambatune.log",
        SambaTuneLogReader,
        "19-Sep 17:39:30 - Info - SUCCESS: Save Configuration File\nElapsed time: 5O4.2s\n",
        2,
        "Elapsed time: expected a number",
    ),
    (
        "synthetic_truncated.profileSession.json",
        PyinstrumentProfileReader,
        '{"start_time": 1663871484.35,\n "duration": 10.7,\n'
        ' "root_frame": {"function": "<module>", "time": 1',
        3,
        "not a JSON profile session",
    ),
    (
        "synthetic_bad_time.profileSession.json",
        PyinstrumentProfileReader,
        '{"start_time": 1.0, "duration": 2.0,\n "root_frame": {"function": "f", "time": "slow"}}',
        None,
        "/root_frame: 'time' should be a number",
    ),
]


@pytest.mark.parametrize(
    ("name", "reader", "text", "line", "message"),
    ERROR_CASES,
    ids=[case[0] for case in ERROR_CASES],
)
def test_unreadable_input_names_the_file_and_line(
    tmp_path: Path, name: str, reader: type, text: str, line: int | None, message: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    assert reader.recognises(path, read_head(path))
    if reader is not PyinstrumentProfileReader:
        # A text log is not lost over one bad line: the line is a problem in the file's
        # line account, with its number and reason, and the rest is read.
        account = reader(path).read().sources[0].lines
        assert account is not None and account.unparsed >= 1
        assert [n for n, why in account.problems if message in why] == [line], account.problems
        return
    with pytest.raises(ArtifactError) as raised:
        reader(path).read()
    where = f"{path}:{line}: " if line is not None else f"{path}: "
    assert str(raised.value).startswith(where)
    assert message in str(raised.value)
