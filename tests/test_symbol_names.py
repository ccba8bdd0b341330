"""Issue 26, names are data: an MLIR symbol name IREE accepts — quotes, ``<``, ``::``, a
backslash — goes through ``dfit compile --dfit-tag``, ``dfit run --mode full`` and the
join, every dispatch joined to its call site and root ID. Symbol references are read
from the attribute (``SymbolRefAttr.value``: escapes decoded, a quoted ``::`` kept in its
name), never from its printed text (``passes/snapshot.py`` ``symbol_path``).
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
from iree.compiler import ir

from dfit_mlir.passes.recordings import _symbol_ref
from dfit_mlir.passes.snapshot import symbol_path

REPO = Path(__file__).resolve().parents[1]

#: A small linalg module, two matmuls (two dispatches); ``NAME`` is replaced by the function's name as MLIR spells it.
MODULE = """\
func.func @NAME(%a: tensor<8x16xf32>, %b: tensor<16x4xf32>, %c: tensor<4x4xf32>) -> tensor<8x4xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<8x4xf32>
  %fill = linalg.fill ins(%zero : f32) outs(%empty : tensor<8x4xf32>) -> tensor<8x4xf32>
  %mm = linalg.matmul ins(%a, %b : tensor<8x16xf32>, tensor<16x4xf32>) outs(%fill : tensor<8x4xf32>) -> tensor<8x4xf32>
  %fill2 = linalg.fill ins(%zero : f32) outs(%empty : tensor<8x4xf32>) -> tensor<8x4xf32>
  %mm2 = linalg.matmul ins(%mm, %c : tensor<8x4xf32>, tensor<4x4xf32>) outs(%fill2 : tensor<8x4xf32>) -> tensor<8x4xf32>
  return %mm2 : tensor<8x4xf32>
}
"""

#: (the name as MLIR spells it, the name as data)
NAMES = [
    ('"we\\"ird<name>"', 'we"ird<name>'),
    ('"a::b"', "a::b"),
    ('"back\\5Cslash"', "back\\slash"),
    # iree-dump-module prints `[ 0] my fn(!vm.ref<?>) -> (...)`: the name is all before the
    # argument list (core/vmfb.py).
    ('"my fn"', "my fn"),
    ('"f(x)"', "f(x)"),
]


@pytest.mark.parametrize(("spelled", "name"), NAMES, ids=[name for _, name in NAMES])
def test_symbol_references_are_read_as_data(spelled: str, name: str) -> None:
    with ir.Context():
        flat = ir.Attribute.parse(f"@{spelled}")
        nested = ir.Attribute.parse(f'@"ex<e>"::@{spelled}')
        assert symbol_path(flat) == [name] and _symbol_ref(flat) == name
        assert symbol_path(nested) == ["ex<e>", name] and _symbol_ref(nested) == name


def _dfit(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "DFIT_CACHE_DIR": str(cwd / ".cache")}
    return subprocess.run([sys.executable, "-m", "dfit_mlir", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize(("spelled", "name"), NAMES, ids=[name for _, name in NAMES])
def test_a_strange_function_name_compiles_runs_and_joins(spelled: str, name: str, tmp_path: Path) -> None:
    (tmp_path / "m.mlir").write_text(MODULE.replace("NAME", spelled))
    done = _dfit("compile", "m.mlir", "--dfit-tag", "--mode", "full", "-o", "m.vmfb", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "dispatches: 2/2 call sites and 2/2 exports attributed to source IDs" in done.stdout, done.stdout
    done = _dfit("run", "m.vmfb", "--mode", "full", "-o", "run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    with open(tmp_path / "run" / "dispatches.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2
    for row in rows:  # every dispatch joined: a call site and the root ID under the function's name
        assert row["site"] != "" and row["root_id"].startswith(f"{name}/"), row
        assert row["partition"].startswith(f"{name}_dispatch_"), row
