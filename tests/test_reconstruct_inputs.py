"""`dfit reconstruct` given what it cannot read (issue 17's campaign): each case is built
from real artifacts (the Edge TPU, SambaNova, Cerebras fixtures of ``../shared``, a
``.vmfb`` IREE compiles here), first reproduced (the reader picks the file the case
spoils, which a clean read recovers) and then answered as a user must be answered:

* refused, exit 2, one ``dfit:`` line naming the file and what is wrong, nothing written:
  a ``.tflite`` that is a ``.vmfb``, empty, a directory, has its identifier bytes altered,
  and an original/compiled pair whose names are swapped (no real dump holds those; read,
  each gave a different, smaller model and no word);
* read with a stated warning and the same model as the clean input: a text log holding
  NUL bytes (a writer that crashed or preallocated its file leaves them; the text around
  them is intact).

And the memory of the text readers: a ~20 MB log repeating one of its real lines is read
in a child process under a generous peak-RSS bound, into the same records as the real
file (marked slow: it reads 20 MB, it is not timed).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import VENDOR_FIXTURES, vendor_fixture
from tests.test_bad_input import invoke, tree

FRANCO = "edgetpu/franco_fc_v15"


def franco_dump(work: Path) -> Path:
    dump = work / "dump"
    shutil.copytree(vendor_fixture(FRANCO), dump)
    return dump


def recovered(bundle: Path) -> dict[str, object]:
    summary = json.loads((bundle / "summary.json").read_text())
    return {key: value for key, value in summary["recovered"].items() if key != "scopes"}


@pytest.fixture(scope="module")
def clean_franco(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """What the clean dump gives: the model every spoiled copy must not pass for."""
    work = tmp_path_factory.mktemp("clean")
    franco_dump(work)
    status, _, stderr, _ = invoke(["reconstruct", "dump", "-o", "b"], work)
    assert status == 0, stderr
    found = recovered(work / "b")
    assert found["operators"] == 4 and found["partitions"] == 1  # 3 original ops + the custom op
    return found


@pytest.fixture(scope="module")
def vmfb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real IREE module: the convnet compiled by iree-compile (no dfit instrumentation)."""
    from iree.compiler import compile_file

    from tests.conftest import CONVNET

    out = tmp_path_factory.mktemp("vmfb") / "convnet.vmfb"
    out.write_bytes(compile_file(str(CONVNET), target_backends=["llvm-cpu"]))
    return out


def _vmfb_as_original(dump: Path, vmfb: Path) -> str:
    shutil.copyfile(vmfb, dump / "model.tflite")
    return "model.tflite"


def _empty_original(dump: Path, vmfb: Path) -> str:
    (dump / "model.tflite").write_bytes(b"")
    return "model.tflite"


def _folder_as_original(dump: Path, vmfb: Path) -> str:
    (dump / "model.tflite").unlink()
    (dump / "model.tflite").mkdir()
    return "model.tflite"


def _identifier_swapped(dump: Path, vmfb: Path) -> str:
    data = bytearray((dump / "model.tflite").read_bytes())
    assert data[4:8] == b"TFL3"
    data[4:8] = b"3LFT"
    (dump / "model.tflite").write_bytes(bytes(data))
    return "model.tflite"


def _pair_swapped(dump: Path, vmfb: Path) -> str:
    original, compiled = (dump / "model.tflite").read_bytes(), (dump / "model_edgetpu.tflite").read_bytes()
    (dump / "model.tflite").write_bytes(compiled)
    (dump / "model_edgetpu.tflite").write_bytes(original)
    return "model.tflite"


#: case -> (spoil the dump: returns the file at fault, what the message must say).
REFUSED = {
    "vmfb-given-as-tflite": (_vmfb_as_original, "not a TFLite model: it is a ZIP archive (an IREE .vmfb is one)"),
    "zero-byte-tflite": (_empty_original, "not a TFLite model: the file is empty (0 bytes)"),
    "directory-named-tflite": (_folder_as_original, "is a directory"),
    "tflite-identifier-swapped": (_identifier_swapped, "bytes 4..8 are b'3LFT'"),
    "original-compiled-pair-swapped": (_pair_swapped, "the original/compiled pair looks swapped"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
@pytest.mark.parametrize("given", ["folder", "file", "auto"])
def test_a_tflite_it_cannot_read_is_refused(name: str, given: str, tmp_path: Path, vmfb: Path,
                                            clean_franco: dict[str, object]) -> None:
    spoil, says = REFUSED[name]
    work = tmp_path / "work"
    work.mkdir()
    dump = franco_dump(work)
    fault = spoil(dump, vmfb)
    if given == "file" and name == "original-compiled-pair-swapped":
        argv = ["reconstruct", "dump/model.tflite", "dump/model_edgetpu.tflite", "dump/model_edgetpu.log"]
    elif given == "file":
        argv = ["reconstruct", f"dump/{fault}", "--backend", "edgetpu"]
    else:
        argv = ["reconstruct", "dump", *(["--backend", "edgetpu"] if given == "folder" else [])]
    before = tree(tmp_path)
    status, stdout, stderr, escaped = invoke([*argv, "-o", "b"], work)
    shown = f"dfit {' '.join(argv)}: exit {status}\nstdout: {stdout}\nstderr: {stderr}"
    assert escaped is None, shown
    assert status == 2, shown
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"dfit: dump/{fault}: "), shown
    assert says in lines[0], shown
    assert "Traceback" not in stdout + stderr
    assert tree(tmp_path) == before, "nothing may be written on a refusal"


def test_the_spoiled_tflite_was_read_as_less_before(tmp_path: Path, vmfb: Path,
                                                    clean_franco: dict[str, object]) -> None:
    """The reproduction: with the refusal taken out (the reader's claim by name
    removed), each spoiled dump reads as a different, smaller model, exit 0, no word
    said: what the refusal above prevents."""
    from dfit_mlir.adapters.edgetpu import matching
    from dfit_mlir.adapters.edgetpu.tflite_model import TFLiteModelReader

    patch = pytest.MonkeyPatch()
    patch.setattr(TFLiteModelReader, "refuses", classmethod(lambda cls, path, head: None))
    patch.setattr(matching, "check_roles", lambda models: None)
    try:
        for name, (spoil, _) in sorted(REFUSED.items()):
            work = tmp_path / name
            work.mkdir()
            spoil(franco_dump(work), vmfb)
            status, _, stderr, _ = invoke(["reconstruct", "dump", "-o", "b"], work)
            assert status == 0 and not stderr.strip(), (name, stderr)
            assert recovered(work / "b") != clean_franco, name
    finally:
        patch.undo()


# --- NUL bytes in a text log: read, with a warning, into the same model ------------------

SAMBANOVA_LOGS = {
    "compile": "sambanova/bertlarge_compile_sf1.17.7_sn30/BertLarge_HW_compile_log_base.out",
    "compile-and-run": "sambanova/ffn_mnist_dataparallel_2021/slurm.out",
    "run": "sambanova/bertlarge_run_dp8_sf1.17.7_sn30/BertLarge.out",
}


def _nul_run(data: bytes, where: str) -> bytes:
    """4 KiB of NUL bytes (a filesystem block a crashed writer never filled) at the
    start, at a line boundary in the middle, or at the end."""
    block = b"\0" * 4096
    if where == "start":
        return block + data
    if where == "end":
        return data + block
    at = data.index(b"\n", len(data) // 2) + 1
    return data[:at] + block + data[at:]


@pytest.mark.parametrize("where", ["start", "middle", "end"])
@pytest.mark.parametrize("log", sorted(SAMBANOVA_LOGS))
def test_a_log_with_nul_bytes_is_read_with_a_warning(log: str, where: str, tmp_path: Path) -> None:
    source = vendor_fixture(SAMBANOVA_LOGS[log])
    results = {}
    for variant in ("clean", "nul"):
        work = tmp_path / variant
        (work / "dump").mkdir(parents=True)
        data = source.read_bytes()
        (work / "dump" / source.name).write_bytes(data if variant == "clean" else _nul_run(data, where))
        status, stdout, stderr, escaped = invoke(["reconstruct", "dump", "-o", "b"], work)
        assert escaped is None and status == 0, stderr
        results[variant] = (recovered(work / "b"), stderr, json.loads((work / "b" / "coverage.json").read_text()))
    (clean, clean_err, _), (nul, nul_err, coverage) = results["clean"], results["nul"]
    assert nul == clean  # the same operators, partitions, measurements as the clean log
    assert "warning" not in clean_err
    [warning] = [line for line in nul_err.splitlines() if line.startswith("dfit: warning:")]
    assert f"dump/{source.name}:" in warning and "NUL bytes" in warning
    [account] = coverage["lines"].values()
    assert account["nul_lines"] == 1
    assert any("NUL bytes" in detail for detail in coverage["notes"]["lines"]["details"])


def test_nul_bytes_no_longer_hide_a_log_from_its_readers(tmp_path: Path) -> None:
    """The reproduction at the recognise step: a head full of NUL bytes used to be read as
    it is, so the readers did not recognise the log (exit 2 "recovered nothing", or a
    job log read by one of its two readers only: 1 measurement of 17)."""
    from dfit_mlir.adapters import sambanova
    from dfit_mlir.adapters.recovery import read_head, readers_of

    source = vendor_fixture(SAMBANOVA_LOGS["compile-and-run"])
    path = tmp_path / source.name
    path.write_bytes(_nul_run(source.read_bytes(), "start"))
    raw = read_head(path)
    # What it was: the run-log reader did not see the run (its markers pushed out of the head).
    assert [reader.format for reader in sambanova.READERS if reader.recognises(path, raw)] == [
        "sambaflow-compile-log"]
    assert [reader.format for reader in readers_of(sambanova.READERS, path)] == [
        "sambaflow-compile-log", "sambaflow-run-log"]


# --- bounded memory: a ~20 MB log of repeated real lines -----------------------------------

#: Peak RSS allowed to the child reading 20 MB over the same child reading the real file:
#: generous (the target in benchmarks/ is 10x the longest line, a few KiB): before the
#: fix a 20 MB Cerebras log of one repeated step line took over 1 GiB.
RSS_GROWTH_BOUND_MIB = 64


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.parametrize("text_format", ["cerebras-run-log", "edgetpu-oplog", "sambatune-log"])
def test_a_20mb_repeated_log_is_read_in_bounded_memory(text_format: str, tmp_path: Path) -> None:
    from benchmarks.reconstruct_memory import BY_NAME, peak_rss_of, repeated_log

    chosen = BY_NAME[text_format]
    vendor_fixture(chosen.fixture)
    path = tmp_path / Path(chosen.fixture).name
    repeated_log(chosen, path, 0, VENDOR_FIXTURES)
    real = peak_rss_of(path, chosen.backend)
    shape = repeated_log(chosen, path, 20 << 20, VENDOR_FIXTURES)
    assert shape["bytes"] >= 20 << 20 and shape["copies"] > 10_000
    big = peak_rss_of(path, chosen.backend)
    growth_mib = (big["peak_rss_kib"] - real["peak_rss_kib"]) / 1024
    assert growth_mib < RSS_GROWTH_BOUND_MIB, (text_format, big, real)
    assert big["lines"] > real["lines"] + 10_000
    # The repeated records are kept once: the same model and measurement count.
    assert big["recovered"] == real["recovered"]


@pytest.mark.parametrize("text_format", ["cerebras-run-log", "sambanova-run-log"])
def test_a_repeated_record_is_kept_once_and_counted(text_format: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The reproduction of the memory case, small: every copy of the repeated line used
    to be one more record (what made a 50 MB log take 2.7 GB); now the record is kept
    once, with how many times it was read and where the last one is."""
    from benchmarks.reconstruct_memory import BY_NAME, repeated_log
    from dfit_mlir.adapters import registry
    from dfit_mlir.adapters.lines import RecordSet

    chosen = BY_NAME[text_format]
    vendor_fixture(chosen.fixture)
    path = tmp_path / Path(chosen.fixture).name
    repeated_log(chosen, path, 0, VENDOR_FIXTURES)
    real = registry.get(chosen.backend).collect([path])
    copies = repeated_log(chosen, path, 400_000, VENDOR_FIXTURES)["copies"]
    assert copies > 200
    kept = registry.get(chosen.backend).collect([path])
    with monkeypatch.context() as patch:  # every record its own: what the readers did
        patch.setattr(RecordSet, "identity", staticmethod(lambda record: str(id(record))))
        every = registry.get(chosen.backend).collect([path])
    per_line = (len(every.measurements) - len(real.measurements)) // copies
    assert per_line >= 1 and len(every.measurements) == len(real.measurements) + per_line * copies
    assert len(kept.measurements) == len(real.measurements)
    repeated = [m for m in kept.measurements if m.attributes.get("repeats")]
    assert len(repeated) == per_line and {m.attributes["repeats"] for m in repeated} == {copies + 1}
    first_line = 1 + path.read_bytes().split(b"\n").index(
        next(line for line in path.read_bytes().split(b"\n") if chosen.repeated.encode() in line))
    assert all(m.origin == f"{path}:{first_line}" for m in repeated)
    assert all(m.attributes["last_origin"] == f"{path}:{first_line + copies}" for m in repeated)
    def figures(measurements: tuple) -> list[tuple]:  # line numbers move with the copies
        return [(m.kind, m.name, m.value, m.unit, m.start_s, m.duration_s, m.step, m.partition,
                 m.attributes.get("run_scope")) for m in measurements]

    assert figures(kept.measurements) == figures(real.measurements)


def test_a_repeated_operation_log_row_is_kept_once_and_counted(tmp_path: Path) -> None:
    """An Edge TPU operation log repeating one row: the row is kept once with its
    repeats; the log's figures still count every row read (as they did, one record per
    row), so nothing the log says is lost."""
    from benchmarks.reconstruct_memory import BY_NAME, repeated_log
    from dfit_mlir.adapters.edgetpu.oplog import OperationLogReader

    chosen = BY_NAME["edgetpu-oplog"]
    vendor_fixture(chosen.fixture)
    path = tmp_path / Path(chosen.fixture).name
    repeated_log(chosen, path, 0, VENDOR_FIXTURES)
    [real] = OperationLogReader(path).logs()
    copies = repeated_log(chosen, path, 200_000, VENDOR_FIXTURES)["copies"]
    [kept] = OperationLogReader(path).logs()
    assert copies > 1000 and len(kept.rows) == len(real.rows)
    [row] = [row for row in kept.rows if row.repeats > 1]
    assert row.repeats == copies + 1 and (row.op_type, row.status) == ("CONV_2D", "Mapped to Edge TPU")
    assert kept.total == real.total + copies * row.count
    assert kept.counts()["CONV_2D"]["Mapped to Edge TPU"] == row.count * (copies + 1)
