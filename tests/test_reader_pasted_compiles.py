"""Compile logs pasted together (issue 11, QA follow-up): each compile of a file is its
own run scope, with its own operators, partitions, PEF, resources and measurements, IDs
that do not collide, and counts that add up to the separate reads. Real fixtures only,
pasted as a user does (LF and CRLF)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from dfit_mlir.adapters.reconstruct import reconstruct_bundle
from dfit_mlir.adapters.recovery import Recovery
from dfit_mlir.adapters.sambanova.compile_log import SambaFlowCompileLogReader
from dfit_mlir.cli.app import main
from tests.conftest import vendor_fixture

SN_117 = "sambanova/bertlarge_compile_sf1.17.7_sn30/BertLarge_HW_compile_log_base.out"
SN_119 = "sambanova/bertlarge_compile_sf1.19.1_sn30/BertLarge.out"


def paste(tmp_path: Path, parts: list[Path], crlf: bool) -> Path:
    """The files' bytes one after the other, as ``cat a b > both`` (or with CRLF endings)."""
    data = b"".join(part.read_bytes() for part in parts)
    if crlf:
        data = data.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
    path = tmp_path / ("both_crlf.out" if crlf else "both.out")
    path.write_bytes(data)
    return path


def scopes_of(recovery: Recovery) -> dict[str, Counter[str]]:
    counts: dict[str, Counter[str]] = {}
    for operator in recovery.operators:
        counts.setdefault(operator.attributes["run_scope"], Counter())["operators"] += 1
    for partition in recovery.partitions:
        counts.setdefault(partition.attributes["run_scope"], Counter())[partition.kind] += 1
    for measurement in recovery.measurements:
        counts.setdefault(measurement.attributes["run_scope"], Counter())["measurements"] += 1
    return counts


def own_counts(recovery: Recovery) -> Counter[str]:
    counts = Counter(p.kind for p in recovery.partitions)
    counts["operators"] = len(recovery.operators)
    counts["measurements"] = len(recovery.measurements)
    return counts


@pytest.mark.parametrize("crlf", [False, True], ids=["lf", "crlf"])
def test_two_sambaflow_compile_logs_pasted_are_two_compiles(tmp_path: Path, crlf: bool) -> None:
    first, second = vendor_fixture(SN_117), vendor_fixture(SN_119)
    alone = [SambaFlowCompileLogReader(first).read(), SambaFlowCompileLogReader(second).read()]
    assert [len(r.operators) for r in alone] == [93, 94]  # today's values of the separate reads
    assert [sum(p.kind == "partition" for p in r.partitions) for r in alone] == [72, 75]
    for recovery in alone:  # a single compile keeps its IDs and carries its scope
        assert {o.attributes["run_scope"] for o in recovery.operators} == {"compile0"}
        assert not any(o.id.startswith("compile") for o in recovery.operators)

    both = SambaFlowCompileLogReader(paste(tmp_path, [first, second], crlf)).read()
    per_scope = scopes_of(both)
    assert list(per_scope) == ["compile0", "compile1"]
    assert [per_scope["compile0"], per_scope["compile1"]] == [own_counts(r) for r in alone]

    # IDs do not collide, and every record points into its own compile.
    ids = [o.id for o in both.operators]
    assert len(ids) == len(set(ids)) == 93 + 94
    partition_ids = [p.id for p in both.partitions]
    assert len(partition_ids) == len(set(partition_ids))
    scope_of_partition = {p.id: p.attributes["run_scope"] for p in both.partitions}
    for operator in both.operators:
        scope = operator.attributes["run_scope"]
        assert operator.id.startswith(scope + "/")
        if operator.partition is not None:
            assert scope_of_partition[operator.partition] == scope
    for partition in both.partitions:
        assert partition.id.startswith(partition.attributes["run_scope"] + "/")
        assert all(i.startswith(partition.attributes["run_scope"] + "/") for i in partition.operator_ids)
    # Resource estimates (partition-level Amortized resources) stay with their compile.
    for measurement in both.measurements:
        if measurement.partition is not None:
            assert scope_of_partition[measurement.partition] == measurement.attributes["run_scope"]
    # Per-scope values equal the separate reads' (durations, PEFs, versions).
    durations = {m.attributes["run_scope"]: m.value for m in both.measurements if m.name == "compile.duration"}
    assert durations == {
        f"compile{i}": next(m.value for m in r.measurements if m.name == "compile.duration")
        for i, r in enumerate(alone)
    }
    compiles = both.attributes["compiles"]
    assert [c["pef_path"] for c in compiles] == [r.attributes["pef_path"] for r in alone]
    assert [c["sambaflow_version"] for c in compiles] == [r.attributes["sambaflow_version"] for r in alone]
    assert [(c["operators"], c["partitions"]) for c in compiles] == [(93, 72), (94, 75)]
    outcomes = [(m.attributes["run_scope"], m.attributes["status"]) for m in both.measurements
                if m.name == "compile.outcome"]
    assert outcomes == [("compile0", "succeeded"), ("compile1", "succeeded")]
    lines = both.sources[0].lines
    assert lines is not None and lines.unparsed == sum(r.sources[0].lines.unparsed for r in alone)


def test_reconstruct_summary_and_cli_count_each_compile(tmp_path: Path) -> None:
    first, second = vendor_fixture(SN_117), vendor_fixture(SN_119)
    path = paste(tmp_path, [first, second], crlf=True)
    summary = reconstruct_bundle([path], tmp_path / "bundle")
    separate = [reconstruct_bundle([p], tmp_path / f"alone{i}")["recovered"] for i, p in enumerate((first, second))]
    scopes = summary["recovered"]["scopes"]
    assert list(scopes) == ["compile0", "compile1"]
    for key in ("operators", "partitions", "partition_groups", "measurements"):
        assert [scopes["compile0"][key], scopes["compile1"][key]] == [s[key] for s in separate]
        assert summary["recovered"][key] == sum(s[key] for s in separate)
    result = CliRunner().invoke(main, ["reconstruct", str(path), "-o", str(tmp_path / "cli")])
    assert result.exit_code == 0, result.output
    assert "found 2 compiles: compile0 93 operators, 72 partitions" in result.output
    assert "compile1 94 operators, 75 partitions" in result.output


# --- the other compile-level text formats, pasted the same way --------------------------

CEREBRAS_REPORTS = (
    "cerebras/docquote_compile_report/compile_report_head_unet_severstal.txt",
    # SYNTHETIC (format-faithful, in the repository): a report with a kernel table.
    Path(__file__).parent / "inputs/cerebras/synthetic_model_dir/cs_4471189405126833117/compile_report.txt",
)
EDGETPU_LOGS = (
    "edgetpu/goalbuddy_yolov8_v16/yolov8n_full_integer_quant_edgetpu.log",
    "edgetpu/goalbuddy_yolov8_v16/yolov8s_full_integer_quant_edgetpu.log",
)


@pytest.mark.parametrize("crlf", [False, True], ids=["lf", "crlf"])
def test_two_cerebras_compile_reports_pasted_are_two_compiles(tmp_path: Path, crlf: bool) -> None:
    from dfit_mlir.adapters.cerebras.reports import CompileReportReader

    parts = [p if isinstance(p, Path) else vendor_fixture(p) for p in CEREBRAS_REPORTS]
    alone = [CompileReportReader(p).read() for p in parts]
    both = CompileReportReader(paste(tmp_path, parts, crlf)).read()
    per_scope = scopes_of(both)
    assert sorted(per_scope) == ["compile0", "compile1"]
    assert [per_scope["compile0"], per_scope["compile1"]] == [own_counts(r) for r in alone]
    assert [(c["estimates"], c["kernels"]) for c in both.attributes["compiles"]] == [(5, 0), (5, 25)]
    for index, recovery in enumerate(alone):  # each report's figures, unchanged, in its scope
        scope = f"compile{index}"
        assert [(m.name, m.value) for m in both.measurements if m.attributes["run_scope"] == scope] == [
            (m.name, m.value) for m in recovery.measurements]
        kernels = [p for p in both.partitions if p.attributes["run_scope"] == scope]
        assert [p.attributes["name"] for p in kernels] == [p.attributes["name"] for p in recovery.partitions]
        # (the pasted file is in no cs_<hash> directory: the IDs carry no compile hash)
        assert [p.id for p in kernels] == [f"{scope}/kernel/{p.attributes['name']}" for p in recovery.partitions]
    lines = both.sources[0].lines
    assert lines is not None and lines.unparsed == 0


def test_one_report_with_a_duplicated_title_stays_one_compile(tmp_path: Path) -> None:
    report = vendor_fixture(CEREBRAS_REPORTS[0]).read_text()
    path = tmp_path / "compile_report.txt"
    path.write_text("Estimated Overall Performance\n" + report)  # the title pasted twice
    from dfit_mlir.adapters.cerebras.reports import CompileReportReader

    recovery = CompileReportReader(path).read()
    assert {m.attributes["run_scope"] for m in recovery.measurements} == {"compile0"}
    assert "compiles" not in recovery.attributes


@pytest.mark.parametrize("crlf", [False, True], ids=["lf", "crlf"])
def test_two_edgetpu_operation_logs_pasted_are_two_compiles(tmp_path: Path, crlf: bool) -> None:
    from dfit_mlir.adapters.edgetpu.oplog import OperationLogReader

    parts = [vendor_fixture(p) for p in EDGETPU_LOGS]
    alone = [OperationLogReader(p).read() for p in parts]
    path = paste(tmp_path, parts, crlf).rename(tmp_path / "yolov8n_full_integer_quant_edgetpu.log")
    both = OperationLogReader(path).read()
    per_scope = scopes_of(both)
    assert [per_scope["compile0"], per_scope["compile1"]] == [own_counts(r) for r in alone]
    for index, recovery in enumerate(alone):
        scope = f"compile{index}"
        assert [(m.attributes["op_type"], m.attributes["status"], m.value, m.attributes["model"])
                for m in both.measurements if m.attributes["run_scope"] == scope] == [
            (m.attributes["op_type"], m.attributes["status"], m.value, m.attributes["model"])
            for m in recovery.measurements]
        assert both.attributes["compiles"][index]["operation_counts"] == recovery.attributes["operation_counts"]
    assert both.sources[0].lines is not None and both.sources[0].lines.unparsed == 0

    # Next to the compiled yolov8n model, the first log is matched to it and the second
    # (yolov8s) stays a log of its own: nothing of one is added to the other.
    fixture_dir = parts[0].parent
    for name in ("yolov8n_full_integer_quant.tflite", "yolov8n_full_integer_quant_edgetpu.tflite"):
        (tmp_path / name).symlink_to(fixture_dir / name)
    summary = reconstruct_bundle([tmp_path], tmp_path / "bundle")
    separate = reconstruct_bundle([fixture_dir / n for n in (
        "yolov8n_full_integer_quant.tflite", "yolov8n_full_integer_quant_edgetpu.tflite",
        "yolov8n_full_integer_quant_edgetpu.log")], tmp_path / "alone")
    assert summary["recovered"]["operators"] == separate["recovered"]["operators"]
    assert summary["recovered"]["scopes"]["compile1"]["measurements"] == own_counts(alone[1])["measurements"]
    assert summary["recovered"]["measurements"] == separate["recovered"]["measurements"] + len(alone[1].measurements)


def test_a_run_job_log_pasted_after_a_compile_is_no_second_compile(tmp_path: Path) -> None:
    compile_log = vendor_fixture(SN_117)
    run_log = vendor_fixture("sambanova/bertlarge_run_dp8_sf1.17.7_sn30/BertLarge.out")
    alone = SambaFlowCompileLogReader(compile_log).read()
    both = SambaFlowCompileLogReader(paste(tmp_path, [compile_log, run_log], crlf=False)).read()
    outcomes = [(m.attributes["run_scope"], m.attributes["status"]) for m in both.measurements
                if m.name == "compile.outcome"]
    # The run's job header starts a scope, but it compiled nothing: its traceback (the run
    # failed) is no compile failure, and the compile's records are unchanged.
    assert outcomes == [("compile0", "succeeded"), ("compile1", "no compile output")]
    assert [o.id for o in both.operators] == [f"compile0/{o.id}" for o in alone.operators]
