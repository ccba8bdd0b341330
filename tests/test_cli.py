"""The `dfit` command line: help, and bad input handled as one clear message, a non-zero
exit, no traceback and no output files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CONVNET

DFIT = [sys.executable, "-m", "dfit_mlir"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DFIT, *args], capture_output=True, text=True)


def test_help_lists_every_command_with_a_purpose() -> None:
    result = run("--help")
    assert result.returncode == 0
    for command in ("compile", "opt", "run", "show"):
        line = next(line for line in result.stdout.splitlines() if line.strip().startswith(command + " "))
        assert len(line.split(None, 1)[1]) > 10


def test_invalid_mlir_reports_the_diagnostic_and_writes_nothing(tmp_path: Path) -> None:
    source = tmp_path / "broken.mlir"
    source.write_text("func.func @f(%a: f32) -> f32 {\n  %0 = arith.addf %a, %b : f32\n  return %0 : f32\n}\n")
    out = tmp_path / "out" / "broken.vmfb"
    result = run("compile", str(source), "--dfit-tag", "-o", str(out))
    assert result.returncode == 2
    assert f"{source}:2:23: error: use of undeclared SSA value name" in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists() and not out.with_name("broken.manifest.json").exists()
    assert not out.parent.exists() or not any(out.parent.glob("*"))


def test_invalid_mlir_in_opt(tmp_path: Path) -> None:
    source = tmp_path / "bad.mlir"
    source.write_text("func.func @f() {\n  %0 = \"test.unknown\"() : () -> i32\n  return\n}\n")
    result = run("opt", "--dfit-tag", str(source))
    assert result.returncode == 2
    assert f"{source}:2:" in result.stderr and "Traceback" not in result.stderr


def test_verifier_errors_are_reported(tmp_path: Path) -> None:
    source = tmp_path / "unverified.mlir"
    source.write_text("func.func @f(%a: f32) -> i32 {\n  return %a : f32\n}\n")
    result = run("opt", "--dfit-tag", str(source))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and f"{source}:2:" in result.stderr


@pytest.mark.parametrize(
    "args, expected",
    [
        (["compile", "missing.mlir", "--dfit-tag", "-o", "x.vmfb"], "missing.mlir: no such file"),
        (["opt", "--dfit-tag", "missing.mlir"], "missing.mlir: no such file"),
        (["compile", str(CONVNET), "--dfit-tag", "--iree-no-such-flag", "-o", "x.vmfb"], "iree-compile rejected the flags"),
        (["show", "missing.manifest.json"], "missing.manifest.json: no such file"),
        (["compile", "model.onnx", "--dfit-tag", "-o", "x.vmfb"], "model.onnx: not a valid ONNX model"),
    ],
)
def test_one_clear_line(args: list[str], expected: str, tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(b"\x08\x07\x12\x04onnx")  # a protobuf header, not MLIR
    result = subprocess.run([*DFIT, *args], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.vmfb").exists()


def test_failed_compile_keeps_the_previous_output(tmp_path: Path) -> None:
    out = tmp_path / "model.vmfb"
    out.write_bytes(b"previous")
    source = tmp_path / "bad.mlir"
    source.write_text("func.func @f( {\n")
    result = run("compile", str(source), "--dfit-tag", "-o", str(out))
    assert result.returncode == 2
    assert out.read_bytes() == b"previous"


def test_show_refuses_unknown_major_version(tmp_path: Path) -> None:
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"schema": "dfit.manifest", "version": "2.0"}))
    result = run("show", str(manifest))
    assert result.returncode == 2
    assert "manifest version 2.0 is not supported; this dfit reads 1.x" in result.stderr


def test_show_reports_bad_json_with_line(tmp_path: Path) -> None:
    manifest = tmp_path / "m.json"
    manifest.write_text('{\n  "schema": "dfit.manifest",\n  "version": \n}\n')
    result = run("show", str(manifest))
    assert result.returncode == 2 and f"{manifest}:4:1: invalid JSON" in result.stderr


def test_run_line_names_the_statistic_it_prints(iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    """`dfit run`'s last line: a full run's time per invocation is iree-benchmark-module's
    mean (it reports no distribution), an in-process run's the median of its calls."""
    vmfb = iree_bundles["manifest"].parent / "full.vmfb"
    full = run("run", str(vmfb), "--mode", "full", "--repeat", "3", "-o", str(tmp_path / "full"))
    assert full.returncode == 0, full.stderr
    summary = json.loads((tmp_path / "full" / "summary.json").read_text())
    assert f"mean invocation {summary['invocation_ns']['mean'] / 1e6:.3f} ms (iree-benchmark-module)" in full.stdout
    ids = run("run", str(vmfb), "--mode", "ids", "--repeat", "3", "-o", str(tmp_path / "ids"))
    assert ids.returncode == 0, ids.stderr
    summary = json.loads((tmp_path / "ids" / "summary.json").read_text())
    assert f"median invocation {summary['invocation_ns']['median'] / 1e6:.3f} ms" in ids.stdout
    assert f"({summary['trace_slices']} trace slices; open trace.pftrace in the Perfetto UI)" in ids.stdout
    # A `none` run keeps no event: nothing to open in the Perfetto UI, and it says so.
    none = run("run", str(vmfb), "--mode", "none", "--repeat", "3", "-o", str(tmp_path / "none"))
    assert none.returncode == 0 and "(no trace slices to draw)" in none.stdout and "Perfetto" not in none.stdout
