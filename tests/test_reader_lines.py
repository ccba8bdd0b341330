"""The line-reader engine and the failures of messy real logs it fixes (issue 11), plus
the vendor-log robustness of issue 13 (linear time on huge lines, numbers that are not
finite, deeply nested CIRH).

Samples written here are labelled SYNTHETIC; the real fixtures in ../shared/fixtures
are read as they are, or pasted together as a user would paste them.
"""

from __future__ import annotations

import calendar
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dfit_mlir.adapters import cerebras, edgetpu, sambanova
from dfit_mlir.adapters.cerebras.logs import ConsoleLogReader
from dfit_mlir.adapters.cerebras.reports import CompileReportReader
from dfit_mlir.adapters.edgetpu.console import ConsoleSummaryReader
from dfit_mlir.adapters.edgetpu.oplog import OperationLogReader
from dfit_mlir.adapters.lines import (
    MAX_ECHO,
    Continue,
    Line,
    balanced,
    clean,
    echo,
    iter_lines,
    read_file,
)
from dfit_mlir.adapters.reconstruct import reconstruct_bundle
from dfit_mlir.adapters.recovery import ArtifactError, LineAccount, Measurement, Recovery, read_head
from dfit_mlir.adapters.sambanova.compile_log import SambaFlowCompileLogReader
from dfit_mlir.adapters.sambanova.run_log import SambaFlowRunLogReader
from dfit_mlir.adapters.sambanova.sambatune import SambaTuneLogReader
from tests.conftest import vendor_fixture

DFIT = [sys.executable, "-m", "dfit_mlir"]
BERT_512 = "cerebras/alcf_bert_large_bs512_r2x/mytest.log"
BERT_2048 = "cerebras/alcf_bert_large_bs2048_r2x/mytest.log"
GNN_PRODUCTS = "cerebras/gnn_graphsage_products_client1.1.0/products_wse_not.log"
SN_COMPILE_117 = "sambanova/bertlarge_compile_sf1.17.7_sn30"


def named(recovery: Recovery, name: str) -> list[Measurement]:
    return [m for m in recovery.measurements if m.name == name]


def account_of(recovery: Recovery) -> LineAccount:
    [source] = recovery.sources
    assert source.lines is not None
    return source.lines


# --- the engine -------------------------------------------------------------------------


def test_decoding_crlf_bom_control_characters_and_carriage_returns(tmp_path: Path) -> None:
    path = tmp_path / "synthetic.log"  # SYNTHETIC
    path.write_bytes(
        b"\xef\xbb\xbfhead\r\n"  # BOM + CRLF
        b"bar 10%\rbar 20%\rrecord after bars\r\n"  # a bar redrawn in place, then a record
        b"^MIteration: 5%|x| 1/20 [..]record after a pasted ^M\n"
        b"\x1b[31mred\x1b[0m text\x07\n"  # ANSI colour and a bell
        b"bad \xff byte\n"
        b"no newline at the end"
    )
    lines = list(iter_lines(path))
    assert [line.text for line in lines] == [
        "head",
        "record after bars",
        "Iteration: 5%|x| 1/20 [..]record after a pasted ^M".replace("^M", ""),
        "red text",
        "bad \ufffd byte",
        "no newline at the end",
    ]
    assert lines[1].overwritten == "bar 10%\rbar 20%"
    assert [line.number for line in lines] == [1, 2, 3, 4, 5, 6]
    assert clean("a\rb\r") == ("b", "a")


def test_accounting_problems_continuations_and_the_nothing_recognisable_error(tmp_path: Path) -> None:
    path = tmp_path / "synthetic.log"  # SYNTHETIC
    path.write_text("ok 1\nnoise\n\nargs(a=1,\n  b=2)\nok x\nok 3\n")
    taken: list[str] = []

    def feed(line: Line) -> bool | Continue:
        if line.text.startswith("args("):
            return Continue(line, line.text, balanced(), lambda text, first: taken.append(text))
        if line.text.startswith("ok "):
            if not line.text[3:].isdigit():
                raise ArtifactError.at(path, line.number, f"not a count: {line.text[3:]!r}")
            taken.append(line.text)
            return True
        return False

    account = read_file(path, feed)
    assert taken == ["ok 1", "args(a=1,\n  b=2)", "ok 3"]
    assert (account.total, account.consumed, account.unparsed) == (7, 5, 2)
    assert account.examples == ((2, "noise"), (6, "ok x"))
    assert account.problems == ((6, "not a count: 'x'"),)
    assert account.unparsed_ranges == ((2, 2), (6, 6))

    nothing = tmp_path / "synthetic_nothing.log"
    nothing.write_text("a\nb\n")
    with pytest.raises(ArtifactError, match=r"synthetic_nothing\.log: no line of this file is recognisable"):
        read_file(nothing, feed)
    only_bad = tmp_path / "synthetic_only_bad.log"
    only_bad.write_text("ok y\n")
    with pytest.raises(ArtifactError, match=r"synthetic_only_bad\.log:1: not a count: 'y'"):
        read_file(only_bad, feed)


def test_merged_accounts_of_two_readers_of_one_file() -> None:
    compile_side = LineAccount(10, 6, 4, ((2, "b"), (3, "c"), (7, "g"), (8, "h")), (), 0, ((2, 3), (7, 8)))
    run_side = LineAccount(10, 7, 3, ((3, "c"), (4, "d"), (5, "e")), (), 0, ((3, 5),))
    merged = LineAccount.merged([compile_side, run_side])
    assert (merged.total, merged.consumed, merged.unparsed) == (10, 9, 1)
    assert merged.examples == ((3, "c"),)


def test_echo_is_capped() -> None:
    assert echo("x" * 10) == repr("x" * 10)
    long = echo("y" * 100_000)
    assert len(long) < MAX_ECHO + 40 and long.endswith("(100000 characters)")
    error = ArtifactError.at("f.log", 3, "z" * 10_000)
    assert len(str(error)) < 500


# --- every fixture: every line accounted for ---------------------------------------------

TEXT_FIXTURES = {
    "edgetpu": (edgetpu, "*.log", "*.txt"),
    "cerebras": (cerebras, "*.log", "*.txt"),
    "sambanova": (sambanova, "*.out", "*.log"),
}


def fixture_accounts() -> dict[str, LineAccount]:
    from dfit_mlir.adapters.reconstruct import line_accounts

    accounts: dict[str, LineAccount] = {}
    for name, (backend, *patterns) in TEXT_FIXTURES.items():
        root = vendor_fixture(name)
        for pattern in patterns:
            for path in sorted(root.rglob(pattern)):
                head = read_head(path)
                sources = [
                    source
                    for reader in backend.READERS
                    if reader.recognises(path, head)
                    for source in reader(path).read().sources
                ]
                accounts.update(line_accounts(sources))
    return accounts


def test_every_line_of_every_text_fixture_is_consumed_by_a_rule() -> None:
    """Reviewed per fixture (see the readers' rules): no unparsed line remains; what
    carries nothing is consumed by a decoration rule that says why."""
    accounts = fixture_accounts()
    assert len(accounts) == 23
    assert {path: a.unparsed for path, a in accounts.items() if a.unparsed} == {}
    assert all(a.total == a.consumed > 0 and not a.problems for a in accounts.values())


# --- the concrete failures of issue 11 ----------------------------------------------------

STAMP = "2024-04-07 09:58:{:02d},226 - apps.trainer - Process ID 3613047 - info     - "
CARET_M_RUN_LOG = (  # SYNTHETIC, shaped on the SN30 run log: a pasted ^M before a cut bar
    "RUN COMMAND: srun --ntasks=2 python hook.py run --pef=/home/u/bertlrg/bertlrg.pef\n"
    "^MIteration:  20%|█▉        | 500/2549 […]" + STAMP.format(11)
    + "epoch:0|local_step:500|global_step:500|step_loss:9.91058|step_ns_loss:0.6\n"
    "^MIteration:  20%|█▉        | 501/2549 [02:11<09:01,  3.78it/s]" + STAMP.format(12)
    + "epoch:0|local_step:501|global_step:501|step_loss:9.80000|step_ns_loss:0.5\n"
    + STAMP.format(40)
    + "{'e2e_train_time': 440.3, 'training_sequences_per_second': 1234.5}\n"
    "Traceback (most recent call last):\n"
    '  File "hook.py", line 10, in <module>\n'
    "    check()\n"
    "AssertionError: Expected throughput to be at least 1500.0, instead found 1234.5\n"
    "srun: error: sn30-r1-h1: tasks 0-1: Exited with exit code 1\n"
)


def test_caret_m_progress_bar_prefix_does_not_hide_the_run(tmp_path: Path) -> None:
    path = tmp_path / "synthetic_run.out"
    path.write_text(CARET_M_RUN_LOG)
    assert SambaFlowRunLogReader.recognises(path, read_head(path))
    recovery = SambaFlowRunLogReader(path).read()
    assert [(m.step, m.value) for m in named(recovery, "loss")] == [(500, 9.91058), (501, 9.8)]
    # The cut bar loses only its own rate; the readable one gives the step time.
    assert [(m.step, round(m.value, 4)) for m in named(recovery, "step_time")] == [(501, round(1 / 3.78, 4))]
    assert recovery.attributes["unreadable_progress_bars"]["count"] == 1
    assert [m.value for m in named(recovery, "training_sequences_per_second")] == [1234.5]
    assert recovery.attributes["task_exits"] == {"0": "Exited with exit code 1", "1": "Exited with exit code 1"}
    assert recovery.attributes["throughput_check"] == {"expected_at_least": 1500.0, "found": 1234.5, "passed": False}
    assert all(m.attributes["run_scope"] == "run0" for m in recovery.measurements)
    account = account_of(recovery)
    assert (account.total, account.unparsed) == (9, 0)


SKIPPED_COMPILE_JOB_LOG = (  # SYNTHETIC: an ALCF job script whose compile step was skipped
    "Model:  BertLarge\nDate:  04/04/24\nTime:  04:26\n\n"
    "sambaflow/focal,focal,now 1.17.7-27 amd64 [installed]\n"
    "Machine State Before: \nPlatform: DataScale SN30-8\n\n"
    "Submitted batch job 40123\n"
    "Duration:  1\n"
)


def test_job_log_with_a_skipped_compile_keeps_its_job_facts(tmp_path: Path) -> None:
    path = tmp_path / "BertLarge.out"
    path.write_text(SKIPPED_COMPILE_JOB_LOG)
    summary = reconstruct_bundle([path], tmp_path / "bundle")
    assert summary["backend"] == "sambanova" and summary["recovered"]["measurements"] == 1
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    [artifact] = manifest["backend_attributes"]["artifacts"]
    facts = artifact["attributes"]
    assert (facts["model"], facts["sambaflow_version"], facts["platform"]) == (
        "BertLarge", "1.17.7-27", "DataScale SN30-8")
    assert facts["submitted_batch_job"] == 40123
    assert facts["compile_status"].startswith("not in this log")
    coverage = json.loads((tmp_path / "bundle" / "coverage.json").read_text())
    assert coverage["lines"][str(path)]["unparsed"] == 0


def namespace(batch: int, name: str) -> str:
    return (
        "args: Namespace(acc_test=False,\n"
        f"    batch_size={batch},\n"
        "    command='compile',\n"
        "    compiler_configs_file='',\n"
        "    data_parallel=False,\n"
        f"    pef_name='{name}',\n"
        "    output_folder='pef')\n"
    )


TWO_COMPILES_2021 = (  # SYNTHETIC, shaped on the 2021 SLURM console: two compiles pasted
    "(venv) wilsonb@sm-01:~/apps$ python ffn.py compile -b 1 --pef-name=ffn\n"
    "[Info][SAMBA][Default] # Placing log files in pef/ffn/ffn.samba.log\n"
    + namespace(1, "ffn")
    + "[Warning][MAC][ReduceCatFaninPass] # Backward graph is trimmed according to requires_grad.\n"
    "[info    ] PEF file /home/wilsonb/pef/ffn//ffn.pef created\n"
    "[info] Compilation succeeded.\n"
    "(venv) wilsonb@sm-01:~/apps$ python ffn.py compile -b 16 --pef-name=ffn16\n"
    "[Info][SAMBA][Default] # Placing log files in pef/ffn16/ffn16.samba.log\n"
    + namespace(16, "ffn16")
    + "[Warning][MAC][ReduceCatFaninPass] # Backward graph is trimmed according to requires_grad.\n"
    "[info    ] PEF file /home/wilsonb/pef/ffn16//ffn16.pef created\n"
    "[info] Compilation succeeded.\n"
)


def test_console_transcript_of_two_compiles_gives_two_compile_scopes(tmp_path: Path) -> None:
    path = tmp_path / "console.txt"
    path.write_text(TWO_COMPILES_2021)
    summary = reconstruct_bundle([path], tmp_path / "bundle")
    assert summary["backend"] == "sambanova"
    recovery = SambaFlowCompileLogReader(path).read()
    outcomes = named(recovery, "compile.outcome")
    assert [(m.attributes["run_scope"], m.attributes["pef_name"], m.attributes["batch_size"],
             m.attributes["status"]) for m in outcomes] == [
        ("compile0", "ffn", 1, "succeeded"), ("compile1", "ffn16", 16, "succeeded")]
    assert recovery.attributes["app_args"]["pef_name"] == "ffn"  # the multi-line Namespace, read
    assert [c["pef_path"] for c in recovery.attributes["compiles"]] == [
        "/home/wilsonb/pef/ffn//ffn.pef", "/home/wilsonb/pef/ffn16//ffn16.pef"]
    assert account_of(recovery).unparsed == 0


def test_gnn_profile_throughput_and_step_prints_are_read() -> None:
    recovery = ConsoleLogReader(vendor_fixture(GNN_PRODUCTS)).read()
    load = named(recovery, "profile.load")
    assert len(load) == 25 and len(named(recovery, "user.throughput")) == 25
    assert len(named(recovery, "user.wall_clock")) == 25
    first = load[0]
    assert (first.step, first.value, first.unit) == (40, 3.01504, "s/step")
    residual = named(recovery, "profile.residual.dev")[0]
    assert (residual.step, residual.value) == (40, 0.000532)
    assert {m.name for m in recovery.measurements if m.name.startswith("profile.host_submit")} == {
        "profile.host_submit.fwd", "profile.host_submit.bwd", "profile.host_submit.opt"}
    assert named(recovery, "user.throughput")[-1].value == 1403.88
    assert named(recovery, "user.wall_clock")[-1].value == 2888.4425
    assert account_of(recovery).unparsed == 0


def test_pasted_runs_are_scopes_with_their_own_batch_size_and_records(tmp_path: Path) -> None:
    path = tmp_path / "mytest.log"  # two real runs pasted into one file
    path.write_text(vendor_fixture(BERT_512).read_text() + vendor_fixture(BERT_2048).read_text())
    recovery = ConsoleLogReader(path).read()
    runs = recovery.attributes["runs"]
    assert [(r["run_scope"], r["effective_batch_size"]) for r in runs] == [("run0", 512), ("run1", 2048)]
    assert [(r["job_ids"], r["compile_hashes"], r["train_steps"]) for r in runs] == [
        (["wsjob-nwjyttgpfktvyh4kpmmz5n", "wsjob-fhinsqdwzqebojjzgbkwgn"], ["cs_8939750200954608837"], 10),
        (["wsjob-nw92pqswybcl37chf7rfoq", "wsjob-z2irjuuhjvbundav2p9d56"], ["cs_12842439843636108263"], 10),
    ]
    processed = named(recovery, "processed_samples")
    assert [(m.attributes["run_scope"], m.value, m.attributes["job_id"]) for m in processed] == [
        ("run0", 512000.0, "wsjob-fhinsqdwzqebojjzgbkwgn"), ("run1", 2048000.0, "wsjob-z2irjuuhjvbundav2p9d56")]
    losses = named(recovery, "train.loss")
    assert [m.attributes["run_scope"] for m in losses] == ["run0"] * 10 + ["run1"] * 10
    hashes = {m.attributes["run_scope"]: m.attributes["compile_hash"] for m in losses}
    assert hashes == {"run0": "cs_8939750200954608837", "run1": "cs_12842439843636108263"}
    saves = named(recovery, "checkpoint.save")
    assert [m.attributes["run_scope"] for m in saves] == ["run0", "run0", "run1", "run1"]


def test_processed_samples_is_an_interval_from_where_its_steps_started() -> None:
    recovery = ConsoleLogReader(vendor_fixture(BERT_512)).read()
    [processed] = named(recovery, "processed_samples")
    beginning = calendar.timegm((2024, 4, 8, 4, 31, 18)) + 0.020  # "Beginning appliance run"
    assert processed.start_s == pytest.approx(beginning)
    assert processed.duration_s == 426.819169997
    # It ends before the step-1000 checkpoint save starts (it used to overlap it).
    final_save = [m for m in named(recovery, "checkpoint.save") if m.step == 1000][0]
    assert final_save.start_s is not None
    assert processed.start_s + processed.duration_s <= final_save.start_s
    assert processed.attributes["placed"] == "from the start of the run's first step window"


def test_compile_headline_does_not_count_section_groups_as_partitions(tmp_path: Path) -> None:
    summary = reconstruct_bundle([vendor_fixture(SN_COMPILE_117)], tmp_path / "bundle")
    assert (summary["recovered"]["partitions"], summary["recovered"]["partition_groups"]) == (72, 3)


# --- numbers that are not numbers (issue 13) --------------------------------------------

BAD_NUMBERS = ("inf", "nan", "-inf", "1" * 5000, "1e999")


def bad_number_files(value: str) -> list[tuple[type, str, str]]:
    """(reader, file name, SYNTHETIC text) with ``value`` where a figure goes."""
    return [
        (OperationLogReader, "m_edgetpu.log",
         "Edge TPU Compiler version 16.0.384591198\nInput: m.tflite\n\nOperator  Count  Status\n\n"
         f"CONV_2D   {value}   Mapped to Edge TPU\nADD   2   Mapped to Edge TPU\n"),
        (ConsoleSummaryReader, "stdout.txt",
         "Edge TPU Compiler version 16.0.384591198\n\nInput model: m.tflite\n"
         f"Input size: {value}KiB\nNumber of Edge TPU subgraphs: {value}\nTotal number of operations: 3\n"),
        (ConsoleLogReader, "run.log",
         "2024-04-08 04:11:19,206 INFO:   Effective batch size is 512.\n"
         "2024-04-08 04:31:18,020 INFO:   Beginning appliance run\n"
         f"2024-04-08 04:32:54,298 INFO:   | Train Device=CSX, Step=100, Loss={value}, "
         "Rate=1.0 samples/sec, GlobalRate=1.0 samples/sec\n"
         f"2024-04-08 04:44:26,488 INFO:   Processed 512 sample(s) in {value} seconds.\n"),
        (CompileReportReader, "compile_report.txt",
         f"Estimated Overall Performance\n----\nSamples/s:   {value}\nActive PEs:   62%\n"),
        (SambaFlowCompileLogReader, "compile.out",
         "COMPILE START AT 0\n[info    ]: Amortized resources overall: "
         f"{value} PCUs, 3 PMUs, projected latency: 6.0e-01 s, FLOPS: 1.2e+02 T/s, DDR_BW: 6.4e+01 GB/s\n"
         "COMPILE END AT 9\n"),
        (SambaFlowRunLogReader, "run.out",
         "RUN COMMAND: srun python app.py run --pef=out/a/a.pef\n"
         "2024-04-07 09:58:11,226 - trainer - Process ID 7 - info     - "
         f"epoch:0|local_step:3|step_loss:{value}\n"
         "2024-04-07 09:58:11,226 - trainer - Process ID 7 - info     - "
         f"{{'e2e_train_time': {value}, 'training_sequences_per_second': 5.0}}\n"),
        (SambaTuneLogReader, "tune.log",
         f"19-Sep 17:39:30 - Info - SUCCESS: Save Configuration File\nElapsed time: {value}s\n"),
    ]


@pytest.mark.parametrize("value", BAD_NUMBERS, ids=["inf", "nan", "-inf", "5000-digits", "1e999"])
def test_non_finite_and_absurd_numbers_become_line_problems_never_values(tmp_path: Path, value: str) -> None:
    import math

    for reader, name, text in bad_number_files(value):
        path = tmp_path / reader.__name__ / name
        path.parent.mkdir()
        path.write_text(text)
        assert reader.recognises(path, read_head(path)), reader
        recovery = reader(path).read()
        assert all(m.value is None or math.isfinite(m.value) for m in recovery.measurements), reader
        account = account_of(recovery)
        assert account.unparsed >= 1 and account.problems, (reader, account)
        assert all(len(why) < 500 for _, why in account.problems)


# --- linear time on a huge line (issue 13) ----------------------------------------------

#: What a format's file holds around the huge line (``{}``), SYNTHETIC.
HUGE_LINE_FILES: dict[str, tuple[type, str, str]] = {
    "edgetpu-oplog": (OperationLogReader, "m_edgetpu.log",
                      "Edge TPU Compiler version 16.0\nInput: m.tflite\n\nOperator  Count  Status\n{}\n"),
    "edgetpu-console": (ConsoleSummaryReader, "stdout.txt",
                        "Edge TPU Compiler version 16.0\n\nInput model: m.tflite\n{}\n"),
    "cerebras-log": (ConsoleLogReader, "run.log",
                     "2024-04-08 04:11:19,206 INFO:   Effective batch size is 512.\n"
                     "2024-04-08 04:11:19,206 INFO:   {}\n{}\n"),
    "cerebras-report": (CompileReportReader, "compile_report.txt",
                        "Estimated Overall Performance\nSamples/s:   5.0\n{}\n"),
    "sambaflow-compile": (SambaFlowCompileLogReader, "compile.out",
                          "COMPILE START AT 0\n[info    ]: Logs are generated in /x for partition_1_0_.\n"
                          "{}\n[info    ]: {}\n[warning ]: {}\n"),
    "sambaflow-run": (SambaFlowRunLogReader, "run.out",
                      "RUN COMMAND: srun python app.py run {}\n{}\n"
                      "2024-04-07 09:58:11,226 - t - Process ID 7 - info     - {}\n"),
    "sambatune": (SambaTuneLogReader, "tune.log",
                  "19-Sep 17:39:30 - Info - SUCCESS: Save Configuration File\n{}\n"
                  "19-Sep 17:39:31 - Info - SUCCESS: {}\n"),
}
#: Line contents that drive backtracking regular expressions quadratic.
HOSTILE: dict[str, Callable[[int], str]] = {
    "spaces": lambda n: "a" + " " * n + "b",
    "words": lambda n: ("Ab semantic version: 1 x=" * (n // 25 + 1))[:n],
    "fields": lambda n: ("| a: 1, b=2 (c:3) " * (n // 18 + 1))[:n],
    "digits": lambda n: ("1 " * (n // 2 + 1))[:n],
    # rail buffer-context chains, repeated --pef= arguments, task lists
    "chains": lambda n: ("partition_1_0_.a." * (n // 17 + 1))[:n],
    "arguments": lambda n: ("--pef=--pef " * (n // 12 + 1))[:n],
}


def read_seconds(reader: type, path: Path) -> float:
    """CPU seconds of the best of three reads (CPU time: the machine is shared)."""
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        try:
            reader(path).read()
        except ArtifactError:
            pass
        best = min(best, time.process_time() - start)
    return best


@pytest.mark.parametrize("fmt", sorted(HUGE_LINE_FILES))
def test_a_one_megabyte_line_reads_in_linear_time(tmp_path: Path, fmt: str) -> None:
    reader, name, template = HUGE_LINE_FILES[fmt]
    for flavour, make in HOSTILE.items():
        times = []
        for size in (100_000, 1_000_000):
            path = tmp_path / f"{flavour}-{size}" / name
            path.parent.mkdir()
            huge = make(size)
            path.write_text(template.format(*([huge] * template.count("{}"))))
            times.append(read_seconds(reader, path))
        small, large = times
        # 10x the text: linear is ~10x; quadratic would be ~100x. Tiny times are noise.
        assert large <= 15 * max(small, 0.02), (fmt, flavour, small, large)


# --- deep nesting (issue 13) --------------------------------------------------------------


def test_a_5000_deep_cirh_dump_is_read_not_crashed(tmp_path: Path) -> None:
    depth = 5000
    lines = ["func.func @train_step(%arg0: tensor<2xf32>) -> tensor<2xf32> {"]
    lines += [f'{"  " * (i + 1)}%{i} = "cirh.Wrap"() ({{' for i in range(depth)]  # SYNTHETIC
    lines.append('"cirh.Yield"(%arg0) : (tensor<2xf32>) -> ()')
    lines += [f'{"  " * (i + 1)}}}) : () -> tensor<2xf32>' for i in reversed(range(depth))]
    lines += ["  return %0 : tensor<2xf32>", "}"]
    dump = tmp_path / "cirh_train.mlir"
    dump.write_text("\n".join(lines) + "\n")
    result = subprocess.run([*DFIT, "reconstruct", str(dump), "-o", str(tmp_path / "b")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["recovered"]["operators"] == depth + 1
    [source] = summary["sources"]
    assert source["parser"] == "line-reader"


def test_data_parallel_ranks_and_pasted_runs_in_a_run_log(tmp_path: Path) -> None:
    """SYNTHETIC, shaped on SambaFlow 1.19 (``Rank R, PID P`` in the app logger): two
    pasted runs of two ranks each; every figure carries its run and rank."""
    def run(pef: str, losses: tuple[float, float]) -> str:
        return (
            f"RUN COMMAND: srun --ntasks=2 python hook.py run --pef={pef}\n"
            + "".join(
                f"2024-11-20 08:0{rank}:00,000 - apps.trainer - Rank {rank}, PID {800 + rank} - info     - "
                f"epoch:0|local_step:1|global_step:1|step_loss:{loss}\n"
                for rank, loss in enumerate(losses)
            )
        )

    path = tmp_path / "run.out"
    path.write_text(run("a/a.pef", (9.5, 9.6)) + run("b/b.pef", (8.5, 8.6)))
    recovery = SambaFlowRunLogReader(path).read()
    assert [(m.attributes["run_scope"], m.attributes["rank"], m.value) for m in named(recovery, "loss")] == [
        ("run0", 0, 9.5), ("run0", 1, 9.6), ("run1", 0, 8.5), ("run1", 1, 8.6)]
    assert [r["pef_path"] for r in recovery.attributes["runs"]] == ["a/a.pef", "b/b.pef"]
    assert recovery.attributes["ranks"] == {"800": 0, "801": 1}


def test_a_line_of_another_task_inside_a_traceback_does_not_end_it(tmp_path: Path) -> None:
    path = tmp_path / "run.out"  # SYNTHETIC: two tasks writing to one log
    path.write_text(
        "RUN COMMAND: srun --ntasks=2 python hook.py run --pef=a/a.pef\n"
        "Traceback (most recent call last):\n"
        '  File "hook.py", line 10, in <module>\n'
        "Distributed run: True\n"
        '  File "hook.py", line 4, in check\n'
        "    assert ok\n"
        "AssertionError: Expected throughput to be at least 1500.0, instead found 1234.5\n"
    )
    recovery = SambaFlowRunLogReader(path).read()
    failure = recovery.attributes["run_failure"]
    assert failure["frames"] == ["hook.py:10 in <module>", "hook.py:4 in check"]
    assert (failure["exception"], failure["lines"]) == ("AssertionError", [2, 7])
    assert recovery.attributes["distributed_tasks_reported"] == 1
    assert account_of(recovery).unparsed == 0


def test_an_op_type_with_two_not_mapped_reasons_keeps_both_with_counts(tmp_path: Path) -> None:
    path = tmp_path / "m_edgetpu.log"  # SYNTHETIC, shaped on the yolov8 logs
    path.write_text(
        "Edge TPU Compiler version 16.0.384591198\nInput: m.tflite\nOutput: m_edgetpu.tflite\n\n"
        "Operator                       Count      Status\n\n"
        "RESHAPE                        2          More than one subgraph is not supported\n"
        "RESHAPE                        3          Operation is otherwise supported, but not mapped due to "
        "some unspecified limitation\n"
        "RESHAPE                        4          Mapped to Edge TPU\n"
    )
    log = OperationLogReader(path).log()
    assert log.cpu_status_counts("RESHAPE") == {
        "More than one subgraph is not supported": 2,
        "Operation is otherwise supported, but not mapped due to some unspecified limitation": 3,
    }
    assert log.cpu_status_counts("ADD") == {}


def test_a_second_operation_log_pasted_into_the_file_is_its_own_scope_not_added_to_the_first(tmp_path: Path) -> None:
    one = vendor_fixture("edgetpu/franco_fc_v15/model_edgetpu.log").read_text()
    path = tmp_path / "model_edgetpu.log"  # a real log pasted twice
    path.write_text(one + one)
    logs = OperationLogReader(path).logs()
    alone = OperationLogReader(vendor_fixture("edgetpu/franco_fc_v15/model_edgetpu.log")).log()
    assert [log.counts() for log in logs] == [alone.counts(), alone.counts()]
    total = len(one.splitlines())
    assert [(log.run_scope, log.first_line) for log in logs] == [("compile0", 1), ("compile1", total + 1)]
    assert logs[0].lines is not None and (logs[0].lines.total, logs[0].lines.unparsed) == (2 * total, 0)
    with pytest.raises(ArtifactError, match=f"holds 2 operation logs \\(lines 1, {total + 1}\\)"):
        OperationLogReader(path).log()  # the one-log API refuses rather than drop one
