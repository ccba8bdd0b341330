"""Inputs are sized before anything allocates them: the given inputs together must fit a
memory budget (a quarter of the machine by default, ``--max-input-bytes`` to change it),
else exit 2 naming the input — on a real compile, through the real CLI."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from dfit_mlir.core.errors import InvalidInputError
from dfit_mlir.runtime_hooks import inputs
from dfit_mlir.runtime_hooks.inputs import check_input_sizes, default_input_budget, element_bytes

DYNAMIC = """
func.func @main(%a: tensor<?x?xf32>) -> tensor<?x?xf32> {
  %0 = math.exp %a : tensor<?x?xf32>
  return %0 : tensor<?x?xf32>
}
"""


def dfit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dfit_mlir", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600)


@pytest.fixture(scope="module")
def dynamic_vmfb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dynamic")
    (root / "m.mlir").write_text(DYNAMIC)
    done = dfit("compile", "m.mlir", "--dfit-tag", "--mode", "ids", "-o", "m.vmfb", cwd=root)
    assert done.returncode == 0, done.stderr
    return root / "m.vmfb"


def test_a_huge_input_into_a_dynamic_argument_is_refused_before_it_is_allocated(dynamic_vmfb: Path,
                                                                                tmp_path: Path) -> None:
    """100000x100000 f32 is 37 GiB: one line naming the input, exit 2, no bundle, and the
    child never grew past a few hundred MiB (nothing was allocated)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    done = dfit("run", str(dynamic_vmfb), "--mode", "ids", "--input", "100000x100000xf32=0", "-o", "run",
                cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"dfit: input 0 (100000x100000xf32=0) is 38146 MiB: the inputs would take 38146 MiB, over the "
        f"{default_input_budget() >> 20} MiB a run may give them (--max-input-bytes SIZE raises it)"]
    assert not (tmp_path / "run").exists()
    # RUSAGE_CHILDREN's peak is the largest child's: under 37 GiB by far, whatever ran before.
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss < max(before, 4 << 20)  # KiB


def test_the_budget_is_an_option(dynamic_vmfb: Path, tmp_path: Path) -> None:
    small = dfit("run", str(dynamic_vmfb), "--mode", "ids", "--input", "64x64xf32=1", "--max-input-bytes", "8KB",
                 "-o", "run", cwd=tmp_path)
    assert small.returncode == 2 and "input 0 (64x64xf32=1) is 16384 bytes" in small.stderr
    fits = dfit("run", str(dynamic_vmfb), "--mode", "ids", "--input", "64x64xf32=1", "--max-input-bytes", "1MB",
                "-o", "run", cwd=tmp_path)
    assert fits.returncode == 0, fits.stderr
    bad = dfit("run", str(dynamic_vmfb), "--input", "2x2xf32=1", "--max-input-bytes", "lots", "-o", "x", cwd=tmp_path)
    assert bad.returncode == 2 and "--max-input-bytes 'lots' is not a size" in bad.stderr


@pytest.mark.parametrize("inputs, budget, refused", [
    (["2x3xf32=0"], 24, None),
    (["2x3xf32=0"], 23, 0),
    (["4xi8=1", "4xi64=1"], 36, None),
    (["4xi8=1", "4xi64=1"], 35, 1),  # the second passes the budget: it is named
    (["3xi1=1"], 3, None),  # bools are bytes
    (["i32=7"], 4, None),  # a scalar: one element
])
def test_sizes_are_shape_times_element(inputs: list[str], budget: int, refused: int | None) -> None:
    if refused is None:
        check_input_sizes(inputs, budget)
    else:
        with pytest.raises(InvalidInputError, match=rf"^input {refused} \("):
            check_input_sizes(inputs, budget)


def test_npy_inputs_are_sized_by_their_file(tmp_path: Path) -> None:
    import numpy as np

    np.save(tmp_path / "a.npy", np.zeros((32, 32), np.float32))
    size = (tmp_path / "a.npy").stat().st_size
    check_input_sizes([f"@{tmp_path / 'a.npy'}"], size)
    with pytest.raises(InvalidInputError, match="input 0"):
        check_input_sizes([f"@{tmp_path / 'a.npy'}"], size - 1)
    assert [element_bytes(t) for t in ("i1", "i8", "f16", "bf16", "f32", "i64")] == [1, 1, 2, 2, 4, 8]


# --- values the IREE tools would wrap, truncate or fail on (SYNTHETIC signatures) --------

@pytest.mark.parametrize("text,dtype,says", [
    ("i32=4294967296", "i32", "outside i32 (-2147483648..4294967295)"),  # ran as 0 before
    ("-1", "ui8", "outside ui8 (0..255)"),
    ("128", "si8", "outside si8 (-128..127)"),
    ("99999999999999999999", "index", "outside index"),
])
def test_a_scalar_outside_its_type_is_refused(text: str, dtype: str, says: str) -> None:
    with pytest.raises(InvalidInputError, match=re.escape(says)):
        inputs.scalar_value(text, {"dtype": dtype, "shape": [], "scalar": True}, 1)


@pytest.mark.parametrize("text,kept", [("255", "255"), ("-128", "-128"), ("i32=4294967295", "4294967295")])
def test_a_scalar_within_its_type_is_kept(text: str, kept: str) -> None:
    dtype = "i32" if text.startswith("i32") else "i8"
    assert inputs.scalar_value(text, {"dtype": dtype, "shape": [], "scalar": True}, 0) == kept


@pytest.mark.parametrize("text,says", [
    ("8xi32=1.5", "'1.5', not an integer (i32)"),  # ran as 1 before
    ("8xi32=1 2 3 4 5 6 7 8 9", "9 values, a 8xi32 takes 8"),
    ("8xi8=1 2 3 4 5 6 7 300", "300, outside i8"),
    ("2x2xf32=1 2 3 x", "'x', not a number (f32)"),
])
def test_a_literal_tensor_is_checked_value_by_value(text: str, says: str) -> None:
    shape = [int(d) for d in text.split("=")[0].split("x")[:-1]]
    argument = {"dtype": text.split("=")[0].split("x")[-1], "shape": shape}
    with pytest.raises(InvalidInputError, match=re.escape(says)):
        inputs.check_inputs([text], [argument])
    good = text.split("=")[0] + "=" + " ".join(["1"] * (shape[0] * (shape[1] if len(shape) > 1 else 1)))
    assert inputs.check_inputs([good], [argument]) == [good]
    assert inputs.check_inputs([text.split("=")[0] + "=[1 1][1 1]" if len(shape) > 1 else good], [argument])
