"""Property-based tests of every text-log reader (hypothesis): real fixtures with noise
lines, control characters, CRLF endings, duplicated headers inserted, or cut short.

Properties: a reader raises nothing but its own :class:`ArtifactError`; its line
account adds up to the file's lines; and the figures recovered from the untouched lines
do not change when only unrecognisable noise is added or the line endings change.
"""

from __future__ import annotations

import math
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dfit_mlir.adapters.cerebras.logs import ConsoleLogReader
from dfit_mlir.adapters.cerebras.reports import CompileReportReader
from dfit_mlir.adapters.edgetpu.console import ConsoleSummaryReader
from dfit_mlir.adapters.edgetpu.oplog import OperationLogReader
from dfit_mlir.adapters.recovery import ArtifactError, Recovery
from dfit_mlir.adapters.sambanova.compile_log import SambaFlowCompileLogReader
from dfit_mlir.adapters.sambanova.run_log import SambaFlowRunLogReader
from dfit_mlir.adapters.sambanova.sambatune import SambaTuneLogReader
from tests.conftest import VENDOR_FIXTURES

#: reader → a real fixture it reads (small ones: hypothesis reads each many times).
CASES: dict[str, tuple[type, str]] = {
    "edgetpu-oplog": (OperationLogReader, "edgetpu/goalbuddy_yolov8_v16/yolov8n_full_integer_quant_edgetpu.log"),
    "edgetpu-console": (ConsoleSummaryReader, "edgetpu/deeppicar_cocompile_stdout_v16/log.txt"),
    "cerebras-log": (ConsoleLogReader, "cerebras/alcf_bert_large_bs512_r2x/mytest.log"),
    "cerebras-gnn-log": (ConsoleLogReader, "cerebras/gnn_graphsage_arxiv_client1.1.0/arxiv_wse_cache.log"),
    "cerebras-report": (CompileReportReader, "cerebras/docquote_compile_report/compile_report_head_unet_severstal.txt"),
    "sambaflow-compile": (SambaFlowCompileLogReader, "sambanova/ffn_mnist_dataparallel_2021/slurm.out"),
    "sambaflow-compile-failure": (SambaFlowCompileLogReader, "sambanova/vit_compile_failure_sn30_2023/error.log"),
    "sambaflow-run": (SambaFlowRunLogReader, "sambanova/ffn_mnist_dataparallel_2021/slurm.out"),
    "sambatune": (SambaTuneLogReader, "sambanova/sambatune_uno_sn10_2022/ccle_09_19_22_11_50.log"),
}

#: Noise no rule recognises: a line that starts with ``~`` and then anything printable,
#: control characters and carriage returns included (never a newline).
NOISE = st.text(
    alphabet=st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)), max_size=60
).map(lambda text: "~ " + text.replace("\r", "\r~ "))


def figures(recovery: Recovery) -> Counter[tuple[str, float | None, int | None]]:
    """What a reader recovered, independent of line numbers and scopes."""
    return Counter(
        (m.name, None if m.value is None else round(m.value, 9), m.step) for m in recovery.measurements
    )


def read(reader: type, data: bytes) -> tuple[Recovery | None, int]:
    """Read ``data`` as the fixture's file; (recovery or None if the reader refused it
    with its own error, the number of lines in the file)."""
    lines = data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "input.log"
        path.write_bytes(data)
        try:
            return reader(path).read(), lines
        except ArtifactError:
            return None, lines


def check_account(recovery: Recovery | None, lines: int) -> None:
    if recovery is None:
        return
    accounts = [s.lines for s in recovery.sources if s.lines is not None]
    assert accounts, "a text reader gives a line account"
    for account in accounts:
        assert account.total == lines
        assert account.consumed + account.unparsed == account.total
        assert account.unparsed == sum(last - first + 1 for first, last in account.unparsed_ranges)
        assert len(account.examples) == min(account.unparsed, 8)
    assert all(m.value is None or math.isfinite(m.value) for m in recovery.measurements)


def fixture_bytes(relative: str) -> bytes:
    path = VENDOR_FIXTURES / relative
    if not path.exists():
        pytest.skip(f"vendor fixture {path} is missing")
    return path.read_bytes()


PROPERTY_SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("case", sorted(CASES))
@PROPERTY_SETTINGS
@given(data=st.data())
def test_noise_and_crlf_change_nothing_recovered(case: str, data: st.DataObject) -> None:
    reader, relative = CASES[case]
    original = fixture_bytes(relative)
    baseline, _ = read(reader, original)
    assert baseline is not None
    lines = original.decode("utf-8", "replace").split("\n")
    inserts = data.draw(st.lists(st.tuples(st.integers(0, len(lines)), NOISE), max_size=6))
    for at, noise in sorted(inserts, reverse=True):
        lines.insert(at, noise)
    ending = data.draw(st.sampled_from(["\n", "\r\n"]))
    mutated = ending.join(lines).encode()
    recovery, count = read(reader, mutated)
    assert recovery is not None
    check_account(recovery, count)
    assert figures(recovery) == figures(baseline)
    # (Up to three interleaved lines inside a traceback are passed over; a fourth ends
    # it, and its later frames are then unparsed: the unparsed count may grow by more
    # than the noise, so it is not compared.)


@pytest.mark.parametrize("case", sorted(CASES))
@PROPERTY_SETTINGS
@given(data=st.data())
def test_cuts_control_characters_and_duplicated_headers_never_crash(case: str, data: st.DataObject) -> None:
    reader, relative = CASES[case]
    original = fixture_bytes(relative)
    lines = original.split(b"\n")
    # Duplicate the head (a log pasted twice starts again), spray control characters
    # into a few lines, then cut the file anywhere (a byte of a UTF-8 character too).
    repeat = data.draw(st.integers(0, 3))
    lines = lines[:repeat] + lines
    for _ in range(data.draw(st.integers(0, 4))):
        at = data.draw(st.integers(0, len(lines) - 1))
        junk = data.draw(st.binary(max_size=6).map(lambda b: bytes(c % 32 for c in b if c % 32 != 10)))
        position = data.draw(st.integers(0, len(lines[at])))
        lines[at] = lines[at][:position] + junk + lines[at][position:]
    joined = b"\n".join(lines)
    cut = data.draw(st.integers(0, len(joined)))
    recovery, count = read(reader, joined[:cut])
    check_account(recovery, count)


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=400), accept=st.integers(0, 2))
def test_the_engine_accounts_for_every_line_of_any_bytes(data: bytes, accept: int) -> None:
    """Any bytes: one Line per line (split on ``\\n`` only), no control character left,
    and consumed + unparsed = total whatever the rules take."""
    from dfit_mlir.adapters.lines import iter_lines, read_file

    expected = data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "any.log"
        path.write_bytes(data)
        lines = list(iter_lines(path))
        assert [line.number for line in lines] == list(range(1, expected + 1))
        assert not any(ch < " " and ch != "\t" for line in lines for ch in line.text)
        account = read_file(path, lambda line: len(line.text) % 3 < accept, required=False)
    assert account.total == expected
    assert account.consumed + account.unparsed == account.total
