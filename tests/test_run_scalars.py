"""`dfit run` on functions with scalar arguments (``%n: index``, ``%n: i32``): the
signature comes from the vmfb's export table (the manifest lists tensors only), scalars
default to 1, are given as ``--input 3`` / ``--input i32=3`` and reach the IREE tools and
the in-process runtime as scalars, in every mode; the join then sees the matmul once per
trip. Also: a wrong input count names the signature, and MLIR source is refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from dfit_mlir.core.errors import InvalidInputError
from dfit_mlir.core.vmfb import ExportedFunction
from dfit_mlir.passes.instrumented_compile import CompileResult, compile_instrumented
from dfit_mlir.runtime_hooks import hal_profile
from dfit_mlir.runtime_hooks.inputs import check_inputs, load_input
from dfit_mlir.runtime_hooks.run import is_mlir_source, run_bundle
from tests.conftest import REPO

SHAPES = REPO / "tests" / "inputs" / "shapes"
#: Program -> (source, index of the scalar trip count, index of the 16x16xf32 tensor).
PROGRAMS = {"index": ("loop_index_scalar.mlir", 0, 1), "i32": ("loop_i32_scalar.mlir", 1, 0)}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CompileResult]:
    root = tmp_path_factory.mktemp("scalars")
    return {name: compile_instrumented(SHAPES / source, root / f"{name}.vmfb", mode="ids")
            for name, (source, _, _) in PROGRAMS.items()}


def ordered(name: str, trips: str, tensor: str = "16x16xf32=0.01") -> list[str]:
    _, scalar_at, _ = PROGRAMS[name]
    return [trips, tensor] if scalar_at == 0 else [tensor, trips]


def dispatch_roots(bundle: Path) -> dict[int, list[str]]:
    events = sorted((e for e in pq.read_table(bundle / "events.parquet").to_pylist() if e["kind"] == "dispatch"),
                    key=lambda e: e["start_ns"])
    grouped: dict[int, list[str]] = {}
    for event in events:
        grouped.setdefault(event["invocation"], []).append(event["root_id"])
    return grouped


def expected_roots(trips: int) -> list[str]:
    return ["loop/linalg.generic#0", *["loop/scf.for#0/linalg.matmul#0"] * trips, "loop/linalg.generic#1"]


@pytest.mark.parametrize("driver", hal_profile.DRIVERS)
@pytest.mark.parametrize("name", PROGRAMS)
def test_scalar_trip_count_in_full_mode(compiled, tmp_path: Path, name: str, driver: str) -> None:
    # Typed (i32=3 / index=3) and bare (3) spellings; warm-up + 2 runs go through
    # iree-benchmark-module, one run through iree-run-module.
    dtype = "index" if name == "index" else "i32"
    for spelling, repeat, warmup in ((f"{dtype}=3", 2, 1), ("3", 1, 0)):
        out = tmp_path / f"b{repeat}"
        result = run_bundle(compiled[name].vmfb, None, out, inputs=ordered(name, spelling), driver=driver,
                            function="loop", repeat=repeat, warmup=warmup)
        assert dispatch_roots(out) == {k: expected_roots(3) for k in range(repeat)}
        scalar = result.summary["inputs"][PROGRAMS[name][1]]
        assert scalar == {"shape": [], "dtype": dtype, "scalar": True, "made": "given", "value": "3"}


@pytest.mark.parametrize("name", PROGRAMS)
def test_scalar_defaults_to_one_and_says_so(compiled, tmp_path: Path, name: str) -> None:
    result = run_bundle(compiled[name].vmfb, None, tmp_path / "b", driver="local-sync")
    assert dispatch_roots(tmp_path / "b") == {0: expected_roots(1)}
    scalar, tensor = (result.summary["inputs"][i] for i in PROGRAMS[name][1:])
    assert scalar["made"] == "scalar-one" and scalar["value"] == "1" and "trip count" in scalar["reason"]
    assert tensor == {"shape": [16, 16], "dtype": "f32", "made": "random-normal"}


@pytest.mark.parametrize(("name", "mode", "given"), [
    ("index", "none", True), ("i32", "none", False), ("index", "ids", False), ("i32", "ids", True),
    ("i32", "lite", True),
])
def test_in_process_modes_take_scalars(compiled, tmp_path: Path, name: str, mode: str, given: bool) -> None:
    inputs = ordered(name, "2") if given else ()
    result = run_bundle(compiled[name].vmfb, None, tmp_path / "b", mode=mode, inputs=inputs, repeat=2)
    assert result.summary["invocations"] == 2
    assert result.summary["inputs"][PROGRAMS[name][1]]["value"] == ("2" if given else "1")
    if mode == "lite":
        # The lite queue pass runs the same scalar through iree-benchmark-module.
        assert result.summary["queue_pass"]["queue_events"] > 0


def test_scalar_reaches_the_in_process_runtime_as_a_python_number() -> None:
    assert load_input("3") == 3 and isinstance(load_input("3"), int)
    assert load_input("0.5") == 0.5
    assert load_input("i32=3").shape == ()  # a 0-d tensor, as for tensor<i32>


#: Export-table declarations (as iree-dump-module prints them) -> parsed arguments.
DECLARATIONS = [
    ("sync func @loop(%input0: index, %input1: tensor<16x16xf32>) -> (%output0: tensor<16x16xf32>)",
     [{"shape": [], "dtype": "index", "scalar": True}, {"shape": [16, 16], "dtype": "f32"}]),
    ("sync func @f(%input0: tensor<?x4xf32>, %input1: i32, %input2: f32) -> ()",
     [{"shape": [None, 4], "dtype": "f32"}, {"shape": [], "dtype": "i32", "scalar": True},
      {"shape": [], "dtype": "f32", "scalar": True}]),
    ("sync func @g(%input0: !hal.buffer) -> ()", None),
]


@pytest.mark.parametrize(("declaration", "arguments"), DECLARATIONS)
def test_export_declaration_arguments(declaration: str, arguments) -> None:
    assert ExportedFunction("f", declaration).arguments == arguments


SIGNATURE = [{"shape": [16, 16], "dtype": "f32"}, {"shape": [], "dtype": "i32", "scalar": True}]


@pytest.mark.parametrize(("inputs", "checked"), [
    (["16x16xf32=1", "3"], ["16x16xf32=1", "3"]),
    (["16x16xf32=1", "i32=7"], ["16x16xf32=1", "7"]),
    (["16x16xf32=1", "si32=-2"], ["16x16xf32=1", "-2"]),
])
def test_scalar_inputs_are_normalised_for_the_tools(inputs: list[str], checked: list[str]) -> None:
    assert check_inputs(inputs, SIGNATURE) == checked


@pytest.mark.parametrize(("inputs", "message"), [
    (["i32=5"], r"^the function takes 2 input\(s\) \(16x16xf32, i32\), 1 given; give one --input per argument"),
    (["16x16xf32=1", "f32=2"], r"^input 1 is f32=2, the function takes a scalar i32 \(give it as --input 2\)$"),
    (["16x16xf32=1", "2.5"], r"^input 1 is 2.5, the function takes an integer \(i32\)$"),
    (["16x16xf32=1", "4xi32=1"], r"^input 1 is '4xi32=1', the function takes a scalar i32"),
    (["3", "3"], r"^input 0 is the scalar 3, the function takes a tensor 16x16xf32 \(give it as 16x16xf32=3\)$"),
])
def test_bad_scalar_inputs_are_one_line_errors(inputs: list[str], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        check_inputs(inputs, SIGNATURE)


def test_scalar_from_a_0d_npy(tmp_path: Path) -> None:
    np.save(tmp_path / "n.npy", np.array(4, np.int32))
    np.save(tmp_path / "v.npy", np.zeros(3, np.int32))
    assert check_inputs(["16x16xf32=1", f"@{tmp_path / 'n.npy'}"], SIGNATURE) == ["16x16xf32=1", "4"]
    with pytest.raises(InvalidInputError, match=r"v.npy: input 1 has shape 3, the function takes a scalar"):
        check_inputs(["16x16xf32=1", f"@{tmp_path / 'v.npy'}"], SIGNATURE)


def test_missing_input_names_the_signature_in_the_cli(compiled, tmp_path: Path) -> None:
    cli = subprocess.run([sys.executable, "-m", "dfit_mlir", "run", str(compiled["i32"].vmfb), "-o",
                          str(tmp_path / "b"), "--input", "i32=5"], capture_output=True, text=True)
    assert cli.returncode == 2 and not (tmp_path / "b").exists()
    assert cli.stderr.strip() == ("dfit: the function takes 2 input(s) (16x16xf32, i32), 1 given; "
                                  "give one --input per argument, in order")


@pytest.mark.parametrize("mode", ["none", "full"])
def test_mlir_source_is_refused_with_how_to_compile_it(tmp_path: Path, mode: str) -> None:
    source = SHAPES / "loop_index_scalar.mlir"
    cli = subprocess.run([sys.executable, "-m", "dfit_mlir", "run", str(source), "-o", str(tmp_path / "b"),
                          "--mode", mode], capture_output=True, text=True)
    assert cli.returncode == 2 and not (tmp_path / "b").exists()
    assert cli.stderr.strip() == (f"dfit: {source}: this is MLIR source, not a compiled module; compile it first "
                                  f"with `dfit compile {source} -o loop_index_scalar.vmfb --dfit-tag`, "
                                  f"then run the .vmfb")
    # Whatever it is named: MLIR text without the .mlir suffix is recognised too.
    renamed = tmp_path / "prog.bin"
    renamed.write_text(source.read_text())
    with pytest.raises(InvalidInputError, match="this is MLIR source"):
        run_bundle(renamed, None, tmp_path / "c", mode=mode)


def test_mlir_source_detection(compiled, tmp_path: Path) -> None:
    bytecode = tmp_path / "prog.bin"
    bytecode.write_bytes(b"ML\xefR\x00\x06rest")  # MLIR bytecode magic (SYNTHETIC)
    assert is_mlir_source(bytecode) and is_mlir_source(SHAPES / "loop.mlir")
    assert not any(is_mlir_source(result.vmfb) for result in compiled.values())  # zip-wrapped vmfbs
