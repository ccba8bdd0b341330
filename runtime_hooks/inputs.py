"""Model inputs in the forms ``iree-run-module`` takes (``2x3xf32=0.5``, ``@x.npy``), the
function signature they must fit (from the manifest), and random inputs drawn for it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from dfit_mlir.errors import InvalidInputError

#: ``iree-run-module`` element type and numpy dtype of each manifest dtype.
DTYPES = {
    "f32": ("f32", "float32"), "f16": ("f16", "float16"), "f64": ("f64", "float64"),
    "i8": ("i8", "int8"), "si8": ("i8", "int8"), "ui8": ("ui8", "uint8"),
    "i32": ("i32", "int32"), "si32": ("i32", "int32"), "i64": ("i64", "int64"), "si64": ("i64", "int64"),
}
#: numpy dtype of each ``iree-run-module`` element type.
ELEMENT_NUMPY = {element: numpy for element, numpy in DTYPES.values()}
INPUT_RE = re.compile(r"^(?P<shape>(?:\d+x)*)(?P<dtype>[a-z]+\d+)=(?P<value>.*)$")


def entry_function(manifest: dict[str, Any], requested: str | None) -> str:
    functions = [op["id"] for op in manifest["operators"]
                 if op["parent"] is None and op["op"] in ("func.func", "util.func")]
    if requested:
        if requested not in functions:
            raise InvalidInputError(f"function {requested!r} is not in the manifest (it has {', '.join(functions)})")
        return requested
    if len(functions) != 1:
        raise InvalidInputError(f"the module has several functions ({', '.join(functions)}); choose one with --function")
    return functions[0]


def signature(manifest: dict[str, Any], function: str) -> list[dict[str, Any]]:
    """The argument tensors of ``function`` (shape, dtype), in order."""
    arguments = [t for t in manifest["tensors"] if t["id"].startswith(f"{function}/arg")]
    return sorted(arguments, key=lambda t: int(t["id"].rsplit("arg", 1)[1]))


def check_inputs(inputs: Sequence[str], arguments: list[dict[str, Any]]) -> None:
    """Inputs written as ``SHAPExDTYPE=...`` must match the signature (one line if not)."""
    if len(inputs) != len(arguments):
        raise InvalidInputError(f"the function takes {len(arguments)} input(s), {len(inputs)} given")
    for index, (text, argument) in enumerate(zip(inputs, arguments, strict=True)):
        if text.startswith("@"):
            check_npy_input(index, Path(text[1:]), argument)
            continue
        match = INPUT_RE.match(text)
        if match is None:
            continue  # other forms are checked by the runtime
        shape = [int(dim) for dim in match["shape"].split("x") if dim]
        wanted = [dim if dim is not None else shape[i] if i < len(shape) else None
                  for i, dim in enumerate(argument["shape"])]
        dtype = DTYPES.get(argument["dtype"], (argument["dtype"], None))[0]
        if shape != wanted or match["dtype"] != dtype:
            expected = "x".join("?" if d is None else str(d) for d in argument["shape"]) + f"x{dtype}"
            raise InvalidInputError(f"input {index} is {match['shape']}{match['dtype']}, the function takes {expected}")


def random_inputs(arguments: list[dict[str, Any]], workdir: Path, seed: int = 0) -> list[str]:
    """``@file.npy`` inputs with random values for the signature (dynamic dims as 1)."""
    generator = np.random.default_rng(seed)
    inputs = []
    for index, argument in enumerate(arguments):
        if argument["dtype"] not in DTYPES:
            raise InvalidInputError(f"cannot make a random input of dtype {argument['dtype']}; give --input")
        dtype = np.dtype(DTYPES[argument["dtype"]][1])
        shape = [dim or 1 for dim in argument["shape"]]
        if dtype.kind == "f":
            values = generator.standard_normal(shape).astype(dtype)
        else:
            info = np.iinfo(dtype)
            values = generator.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
        path = workdir / f"input{index}.npy"
        np.save(path, values)
        inputs.append(f"@{path}")
    return inputs


def splat_inputs(arguments: list[dict[str, Any]], value: float = 1) -> list[str]:
    """``SHAPExDTYPE=value`` inputs for the signature (dynamic dims as 1)."""
    return ["x".join(str(dim or 1) for dim in a["shape"]) + f"x{DTYPES[a['dtype']][0]}={value}" for a in arguments]


def inputs_from(directory: Path) -> list[str]:
    """Every ``*.npy`` in ``directory``, in name order, as ``@file`` inputs."""
    if not directory.is_dir():
        raise InvalidInputError(f"{directory}: no such directory")
    files = sorted(directory.glob("*.npy"))
    if not files:
        raise InvalidInputError(f"{directory}: no .npy inputs in it")
    return [f"@{path}" for path in files]


def load_input(text: str) -> np.ndarray:
    """An input in ``iree-run-module`` form: ``@x.npy`` or ``2x3xf32=0.5`` (a splat)."""
    if text.startswith("@"):
        path = Path(text[1:])
        try:
            return np.load(path)
        except (OSError, ValueError) as error:
            raise InvalidInputError(f"{path}: not a readable .npy file ({error})") from None
    match = INPUT_RE.match(text)
    if match is None or match["dtype"] not in ELEMENT_NUMPY:
        raise InvalidInputError(f"input {text!r} is neither @file.npy nor SHAPExDTYPE=VALUE")
    shape = [int(dim) for dim in match["shape"].split("x") if dim]
    try:
        value = float(match["value"])
    except ValueError:
        raise InvalidInputError(f"input {text!r}: only splat values are supported here") from None
    return np.full(shape, value, dtype=ELEMENT_NUMPY[match["dtype"]])


def check_npy_input(index: int, path: Path, argument: dict[str, Any]) -> None:
    """An ``@file.npy`` input must be a readable array of the argument's shape and dtype
    (read from the header only: a large input is not loaded twice)."""
    try:
        with open(path, "rb") as handle:
            version = np.lib.format.read_magic(handle)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, _, dtype = read_header(handle)
    except FileNotFoundError:
        raise InvalidInputError(f"{path}: no such file (input {index})") from None
    except IsADirectoryError:
        raise InvalidInputError(f"{path}: is a directory, not an .npy file (input {index})") from None
    except (OSError, ValueError, EOFError, SyntaxError) as error:
        reason = str(error).splitlines()[0][:160] if str(error) else type(error).__name__
        raise InvalidInputError(f"{path}: not a readable .npy file (input {index}: {reason})") from None
    if dtype.hasobject:
        raise InvalidInputError(f"{path}: holds Python objects (a pickled array), not numbers (input {index})")
    expected_bytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if path.stat().st_size < expected_bytes:
        raise InvalidInputError(f"{path}: truncated (its header promises {expected_bytes} bytes of data; input {index})")
    wanted_dtype = DTYPES.get(argument["dtype"], (None, None))[1]
    wanted_shape = argument["shape"]
    shape_ok = len(shape) == len(wanted_shape) and all(
        want is None or want == got for want, got in zip(wanted_shape, shape, strict=True))
    if not shape_ok or (wanted_dtype is not None and dtype != np.dtype(wanted_dtype)):
        expected = "x".join("?" if d is None else str(d) for d in wanted_shape) + f" {wanted_dtype or argument['dtype']}"
        got = "x".join(str(d) for d in shape) or "scalar"
        raise InvalidInputError(f"{path}: input {index} is {got} {dtype}, the function takes {expected}")
