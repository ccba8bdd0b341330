"""Backend registry, capability discovery and `dfit reconstruct`: closed-backend dumps
become the same bundle an IREE run writes (validated manifest, normalized events,
Perfetto trace) plus a coverage report."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from importlib import metadata
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dfit_mlir.adapters import registry
from dfit_mlir.adapters.base import ASPECTS, STEPS, UnsupportedStep
from dfit_mlir.adapters.reconstruct import reconstruct_bundle
from dfit_mlir.core import event_schema as es
from dfit_mlir.core import manifest, outputs
from dfit_mlir.core.errors import InvalidInputError
from tests.conftest import read_pftrace, vendor_fixture

DFIT = [sys.executable, "-m", "dfit_mlir"]
TOY = metadata.EntryPoint(name="toy", value="tests.plugins.toy_backend:ToyAdapter", group=registry.ENTRY_POINT_GROUP)


def dfit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DFIT, *args], capture_output=True, text=True)


# --- registry -----------------------------------------------------------------------

def test_builtin_backends_and_their_lifecycles() -> None:
    names = registry.providers([])
    assert sorted(names) == ["cerebras", "edgetpu", "iree", "sambanova"]
    iree = registry.get("iree", [])
    assert iree.steps() == dict.fromkeys(STEPS, True)
    assert iree.capabilities()["path"] == "compiler-visible"
    for name in ("edgetpu", "sambanova", "cerebras"):
        adapter = registry.get(name, [])
        assert adapter.steps() == {"prepare": False, "compile": False, "load": False, "run": False, "collect": True}
        descriptor = adapter.capabilities()
        assert descriptor["backend"] == name and descriptor["path"] == "reconstruction"
        assert set(ASPECTS) <= set(descriptor["exposes"]), f"{name} leaves aspects undeclared"
        with pytest.raises(UnsupportedStep, match=f"the {name} backend cannot run here"):
            adapter.run(Path("x"), Path("y"))


def test_plugin_backend_through_an_entry_point(tmp_path: Path) -> None:
    assert registry.providers([TOY])["toy"].origin == "an unnamed distribution"
    dump = tmp_path / "dump"
    dump.mkdir()
    (dump / "run.toylog").write_text("TOY\nmatmul 2.5\nrelu 0.5\n")  # synthetic toy-backend log
    (dump / "notes.txt").write_text("not for any reader\n")
    adapter = registry.detect([dump], [TOY])
    assert adapter.name == "toy"
    summary = reconstruct_bundle([dump], tmp_path / "bundle", adapter)
    assert summary["backend"] == "toy" and summary["recovered"]["operators"] == 2
    document = manifest.load(tmp_path / "bundle" / "manifest.json")
    assert [op["id"] for op in document["operators"]] == ["toy/matmul#0", "toy/relu#1"]
    events = pq.read_table(tmp_path / "bundle" / "events.parquet").to_pylist()
    assert [(e["root_id"], e["name"], e["value"], e["backend"]) for e in events] == [
        ("toy/matmul#0", "op_time", 0.0025, "toy"), ("toy/relu#1", "op_time", 0.0005, "toy")]


def test_duplicate_backend_names_are_an_error() -> None:
    clash = metadata.EntryPoint(name="edgetpu", value="tests.plugins.toy_backend:ToyAdapter",
                                group=registry.ENTRY_POINT_GROUP)
    with pytest.raises(registry.RegistryError, match=r"'edgetpu' is provided twice: by built-in .* and by "):
        registry.providers([clash])


def test_a_plugin_that_is_not_an_adapter() -> None:
    bad = metadata.EntryPoint(name="bad", value="tests.plugins.toy_backend:NotAnAdapter",
                              group=registry.ENTRY_POINT_GROUP)
    with pytest.raises(registry.RegistryError, match="is not a dfit adapter"):
        registry.get("bad", [bad])
    with pytest.raises(InvalidInputError, match="unknown backend 'nope'; known: cerebras, edgetpu"):
        registry.get("nope", [])


# --- detection ----------------------------------------------------------------------

@pytest.mark.parametrize("relative, backend", [
    ("edgetpu/goalbuddy_yolov8_v16", "edgetpu"),
    ("edgetpu/deeppicar_cocompile_stdout_v16", "edgetpu"),
    ("sambanova/bertlarge_compile_sf1.17.7_sn30", "sambanova"),
    ("sambanova/pyinstrument_uno_sn10_2022", "sambanova"),
    ("cerebras/alcf_bert_large_bs512_r2x", "cerebras"),
    ("cerebras/gnn_cerebras_logs_json_client1.14.0", "cerebras"),
])
def test_backend_detected_from_content(relative: str, backend: str) -> None:
    assert registry.detect([vendor_fixture(relative)], []).name == backend


def test_discovery_picks_the_path() -> None:
    """MLIR / vmfb inputs take the compiler-visible path; dumps the reconstruction that
    recognises them."""
    assert registry.discover([Path("model.mlir")], []).name == "iree"
    assert registry.discover([Path("out/model.vmfb")], []).name == "iree"
    assert registry.discover([vendor_fixture("edgetpu/franco_fc_v15")], []).name == "edgetpu"


def test_nothing_recognised(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hello\n")
    with pytest.raises(InvalidInputError, match="no backend recognises any of the 1 file"):
        registry.detect([tmp_path], [])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InvalidInputError, match="no files in"):
        registry.detect([empty], [])


def test_two_backends_tied_names_each_backends_files(tmp_path: Path) -> None:
    """Real dumps of two backends, one file each: the error says which file which backend
    recognises (not just "both recognise 1 file(s)"), and the CLI exits 2 on one line."""
    cerebras = vendor_fixture("cerebras/alcf_bert_large_bs512_r2x") / "mytest.log"
    sambanova = vendor_fixture("sambanova/bertlarge_compile_sf1.17.7_sn30") / "BertLarge_HW_compile_log_base.out"
    with pytest.raises(InvalidInputError) as raised:
        registry.detect([cerebras, sambanova], [])
    message = str(raised.value)
    assert f"cerebras recognises {cerebras}" in message
    assert f"sambanova recognises {sambanova}" in message
    assert "--backend" in message
    done = subprocess.run([*DFIT, "reconstruct", str(cerebras), str(sambanova),
                           "-o", str(tmp_path / "out")], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert f"cerebras recognises {cerebras}" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


# --- bundles from real dumps ----------------------------------------------------------

def _bundle(tmp_path: Path, *relative: str) -> tuple[Path, dict, list[dict]]:
    out = tmp_path / "bundle"
    summary = reconstruct_bundle([vendor_fixture(r) for r in relative], out)
    document = manifest.load(out / "manifest.json")  # validates against the schema
    events = pq.read_table(out / "events.parquet").to_pylist()
    assert summary["counts"]["kept"] == len(events) == summary["recovered"]["measurements"]
    assert pq.read_schema(out / "events.parquet").metadata[b"dfit.version"] == es.SCHEMA_VERSION.encode()
    _, trace_events = read_pftrace(out / "trace.pftrace")
    assert len(trace_events) >= sum(e["start_ns"] is not None for e in events)
    return out, document, events


def test_edgetpu_yolov8n_bundle(tmp_path: Path) -> None:
    out, document, events = _bundle(tmp_path, "edgetpu/goalbuddy_yolov8_v16")
    groups = {g["kind"]: g for g in document["partitions"]["groups"]}
    assert len(groups["edgetpu-custom-op"]["operator_ids"]) == 233
    assert len(groups["cpu"]["operator_ids"]) == 23
    ops = {op["id"]: op for op in document["operators"]}
    on_cpu = [ops[i] for i in groups["cpu"]["operator_ids"]]
    assert all(op["op"].startswith("tflite.") and op["partition"] for op in on_cpu)
    assert document["capabilities"]["backend"] == "edgetpu" and document["compile"]["mode"] == "reconstructed"
    # The operation log's counts, one metric event per table row.
    assert {e["name"] for e in events} == {"operation_count"}
    coverage = json.loads((out / "coverage.json").read_text())
    assert coverage["aspects"]["per_op_timing"] == "not-exposed"
    assert coverage["aspects"]["partitions"] == "recovered"


def test_sambanova_bundle(tmp_path: Path) -> None:
    _, document, events = _bundle(tmp_path, "sambanova/bertlarge_compile_sf1.17.7_sn30",
                                  "sambanova/bertlarge_run_dp8_sf1.17.7_sn30")
    kinds = Counter(g["kind"] for g in document["partitions"]["groups"])
    assert kinds["partition"] == 72
    losses = [e for e in events if e["name"] == "loss"]
    assert len(losses) == 505 and losses[-1]["step"] == 505 and losses[-1]["value"] == pytest.approx(8.23795)
    pcus = [e for e in events if e["name"] == "amortized.pcus"]
    assert [e["value"] for e in pcus] == [450]
    layer3_key = [op for op in document["operators"] if op["name_path"][:4] == ["bert", "encoder", "layer", "3"]]
    assert layer3_key, "module paths survive into the manifest"


def test_cli_reconstruct_and_backends(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    result = dfit("reconstruct", str(vendor_fixture("edgetpu/franco_fc_v15")), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "edgetpu (detected)" in result.stdout and "per_op_timing" in result.stdout
    assert sorted(p.name for p in out.iterdir()) == [
        ".dfit-output.json", "coverage.json", "dispatches.csv", "events.csv", "events.parquet", "manifest.json", "sites.parquet",
        "summary.json", "trace.json", "trace.pftrace"]
    listing = dfit("backends", "--json")
    assert listing.returncode == 0
    names = {row["name"]: row for row in json.loads(listing.stdout)}
    assert names["iree"]["steps"]["run"] and not names["edgetpu"]["steps"]["run"]


def test_cli_reconstruct_errors_leave_the_old_bundle(tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "previous.txt").write_text("kept")
    outputs.write_marker(bundle, "bundle")  # a previous dfit bundle: replaceable, so only the bad input stops it
    missing = dfit("reconstruct", str(tmp_path / "nope"), "-o", str(bundle))
    assert missing.returncode == 2 and "nope: no such file or directory" in missing.stderr
    wrong = dfit("reconstruct", str(vendor_fixture("edgetpu/franco_fc_v15")), "--backend", "sambanova",
                 "-o", str(bundle))
    assert wrong.returncode == 2 and "the sambanova readers recovered nothing" in wrong.stderr
    assert "Traceback" not in missing.stderr + wrong.stderr
    assert sorted(p.name for p in bundle.iterdir()) == [".dfit-output.json", "previous.txt"]


def test_corrupt_artifact_names_file_and_line(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    shutil.copytree(vendor_fixture("edgetpu/franco_fc_v15"), dump)
    log = dump / "model_edgetpu.log"
    lines = log.read_text().splitlines()
    assert lines[-1].split()[:2] == ["FULLY_CONNECTED", "2"]
    lines[-1] = lines[-1].replace(" 2 ", " two ", 1)  # synthetic corruption of a count
    log.write_text("\n".join(lines) + "\n")
    result = dfit("reconstruct", str(dump), "-o", str(tmp_path / "b"))
    # One bad row does not lose the dump: the bundle is written, the CLI says how many
    # lines were not parsed, and coverage.json names the file, the line and the reason.
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "1 line(s) of 1 file(s) not parsed" in result.stdout
    coverage = json.loads((tmp_path / "b" / "coverage.json").read_text())
    account = coverage["lines"][str(log)]
    assert (account["total"], account["consumed"], account["unparsed"]) == (len(lines), len(lines) - 1, 1)
    assert account["examples"] == [[len(lines), lines[-1]]]
    assert account["problems"][0][0] == len(lines)
    assert account["problems"][0][1].startswith("malformed operation table row")
    assert any(f"{log}:{len(lines)}: malformed" in d for d in coverage["notes"]["lines"]["details"])
    # Every other text file of the dump is accounted for in full.
    assert all(a["unparsed"] == 0 for path, a in coverage["lines"].items() if path != str(log))


def test_file_with_nothing_recognisable_is_an_error_naming_it(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    dump.mkdir()
    log = dump / "synthetic_edgetpu.log"  # SYNTHETIC: a header and nothing readable after it
    log.write_text("Edge TPU Compiler version 16.0.384591198\nInput: m.tflite\n")
    result = dfit("reconstruct", str(log), "-o", str(tmp_path / "b"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert str(log) in result.stderr
    assert not (tmp_path / "b").exists()
