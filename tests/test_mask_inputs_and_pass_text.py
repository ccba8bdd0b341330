"""Smaller items of issue 28: a bool (mask) input defaults to all true and says so; a bool
tensor given as text (``--input 2x4xi1=1``) runs in every mode (the IREE tools misread
``i1`` text); ``dfit show --passes`` wraps at a readable width."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dfit_mlir.core.errors import InvalidInputError
from dfit_mlir.passes.compile_report import PASS_TEXT_WIDTH, pass_histories
from dfit_mlir.passes.pass_history import PassChange, to_table
from dfit_mlir.runtime_hooks.inputs import check_inputs, default_inputs

MASK = {"id": "main/arg1", "shape": [2, 4], "dtype": "i1"}
SCORES = {"id": "main/arg0", "shape": [2, 4], "dtype": "f32"}

#: A masked softmax: where the mask is false the score is -inf, so an all-false mask
#: gives 0/0 = NaN in every row.
MASKED_SOFTMAX = """
#map = affine_map<(d0, d1) -> (d0, d1)>
module @masked {
  func.func @main(%x: tensor<2x4xf32>, %m: tensor<2x4xi1>) -> tensor<2x4xf32> {
    %ninf = arith.constant 0xFF800000 : f32
    %e = tensor.empty() : tensor<2x4xf32>
    %s = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%x, %m : tensor<2x4xf32>, tensor<2x4xi1>) outs(%e : tensor<2x4xf32>) {
    ^bb0(%a: f32, %b: i1, %o: f32):
      %v = arith.select %b, %a, %ninf : f32
      linalg.yield %v : f32
    } -> tensor<2x4xf32>
    %e2 = tensor.empty() : tensor<2x4xf32>
    %r = linalg.softmax dimension(1) ins(%s : tensor<2x4xf32>) outs(%e2 : tensor<2x4xf32>) -> tensor<2x4xf32>
    return %r : tensor<2x4xf32>
  }
}
"""


def test_a_bool_input_defaults_to_all_true_and_says_why(tmp_path: Path) -> None:
    inputs, plans = default_inputs([SCORES, MASK], tmp_path)
    mask = np.load(inputs[1][1:])
    assert mask.dtype == np.bool_ and mask.shape == (2, 4) and mask.all()
    assert plans[1].made == "all-true" and "mask" in (plans[1].reason or "") and "NaN" in (plans[1].reason or "")
    entry = plans[1].summary_entry(MASK, inputs[1])
    assert entry["made"] == "all-true" and entry["reason"].startswith("input 1 is bool")
    assert plans[0].made == "random-normal"


@pytest.mark.parametrize(("given", "passed"), [
    ("2x4xi1=1", "2x4xi8=1"),
    ("2x4xi1=true", "2x4xi8=1"),
    ("2x4xi1=[1 0 1 1][True false 1 1]", "2x4xi8=[1 0 1 1][1 0 1 1]"),
    ("2x4xi1=1,0,1,1,1,1,0,0", "2x4xi8=1,0,1,1,1,1,0,0"),
])
def test_bool_text_is_passed_as_bytes(given: str, passed: str) -> None:
    assert check_inputs(["2x4xf32=1", given], [SCORES, MASK]) == ["2x4xf32=1", passed]


@pytest.mark.parametrize(("given", "says"), [
    ("2x4xi1=2", "a bool (i1) tensor takes 0/1 or true/false values"),
    ("2x4xi1=0xFF", "a bool (i1) tensor takes 0/1 or true/false values"),
    ("4x2xi1=1", "input 1 is 4x2xi1, the function takes 2x4xi1"),
])
def test_bool_text_that_is_not_a_mask_is_refused_in_one_line(given: str, says: str) -> None:
    with pytest.raises(InvalidInputError, match=re.escape(says)):
        check_inputs(["2x4xf32=1", given], [SCORES, MASK])


def _dfit(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dfit_mlir", *args], capture_output=True, text=True, cwd=cwd)


def test_masked_model_runs_with_a_default_or_given_mask(tmp_path: Path) -> None:
    """Through the front door: the default run says its mask is all true; a mask given as
    text runs under iree-run-module (full) and in process (ids); a value that is no bool
    is one line and exit 2, never IREE's parse error and exit 3."""
    (tmp_path / "masked.mlir").write_text(MASKED_SOFTMAX)
    done = _dfit("compile", "masked.mlir", "--dfit-tag", "-o", "masked.vmfb", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    plain = _dfit("run", "masked.vmfb", "-o", "run", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert "note: input 1 is bool (a mask, most likely): all true" in plain.stderr
    for mode in ("full", "ids"):
        given = _dfit("run", "masked.vmfb", "-o", f"run-{mode}", "--mode", mode, "--input", "2x4xf32=1",
                      "--input", "2x4xi1=1", cwd=tmp_path)
        assert given.returncode == 0, (mode, given.stderr)
    bad = _dfit("run", "masked.vmfb", "-o", "run-bad", "--input", "2x4xf32=1", "--input", "2x4xi1=7", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "binary hex" not in bad.stderr, bad.stderr


def test_show_passes_wraps_a_pass_that_fused_hundreds_of_ops() -> None:
    """One pass putting an op into a region with 300 others printed one ~9,000-character
    line: each line now fits the width (the pass's own line names its first roots), and
    repeated op kinds are counted."""
    partners = tuple(f"main/linalg.generic#{n}" for n in range(300))
    change = PassChange("main/linalg.matmul#0", "iree-dispatch-creation-form-dispatch-regions", 412,
                        "dispatch-creation", "func.func", "p", "f", partners,
                        ("linalg.matmul",), ("linalg.matmul", *("linalg.generic",) * 300, "arith.addf"),
                        partners[:9])
    stages = ["source", "input", "abi", "preprocessing", "global-optimization", "dispatch-creation", "flow"]
    manifest = {"pass_history": to_table([change], threads="1"),
                "lineage": {"stages": stages, "classes": {change.id: "ppppppf"}}}
    text = pass_histories(manifest, ("main/linalg.matmul#0",))
    lines = text.splitlines()
    assert lines[0].startswith("main/linalg.matmul#0: source=preserved input=preserved")
    assert max(len(line) for line in lines if "#412" not in line) <= PASS_TEXT_WIDTH
    [pass_line] = [line for line in lines if "#412" in line]
    assert "iree-dispatch-creation-form-dispatch-regions" in pass_line and "into the dispatch region of" in pass_line
    assert "(+5)" in pass_line and len(pass_line) < 2 * PASS_TEXT_WIDTH + 40
    assert "linalg.generic ×300" in text and "(+296)" in text
    assert len(text) < 1500
