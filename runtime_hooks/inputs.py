"""Model inputs in the forms ``iree-run-module`` takes (``2x3xf32=0.5``, ``@x.npy``), the
function signature they must fit (from the manifest), and random inputs drawn for it."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from dfit_mlir.core.errors import InvalidInputError

#: ``iree-run-module`` element type and numpy dtype of each manifest dtype.
DTYPES = {
    "f32": ("f32", "float32"), "f16": ("f16", "float16"), "f64": ("f64", "float64"),
    "i8": ("i8", "int8"), "si8": ("i8", "int8"), "ui8": ("ui8", "uint8"),
    "i32": ("i32", "int32"), "si32": ("i32", "int32"), "i64": ("i64", "int64"), "si64": ("i64", "int64"),
    "i16": ("i16", "int16"), "si16": ("i16", "int16"), "ui16": ("ui16", "uint16"), "ui32": ("ui32", "uint32"),
    "ui64": ("ui64", "uint64"), "i1": ("i1", "bool"),
}
#: numpy dtype of each ``iree-run-module`` element type.
ELEMENT_NUMPY = {element: numpy for element, numpy in DTYPES.values()}
INPUT_RE = re.compile(r"^(?P<shape>(?:\d+x)*)(?P<dtype>[a-z]+\d+)=(?P<value>.*)$")


def entry_function(manifest: dict[str, Any], requested: str | None) -> str:
    """The function to run: ``requested``, or the module's only public one. Public
    functions come from the compiled host program (private helpers such as JAX's
    ``log_softmax`` are not entry points; ``$async`` twins of a sync function are not
    offered by default)."""
    host = manifest.get("partitions", {}).get("host_functions")
    if host:
        functions = [name for name, f in host.items() if f["public"] and not f["initializer"]]
        if requested is None:
            functions = [name for name in functions if not (name.endswith("$async") and name[:-6] in functions)]
    else:
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


def describe(arguments: list[dict[str, Any]]) -> str:
    """The signature as a user writes inputs for it: ``(index, 16x16xf32)``."""
    return "(" + ", ".join(argument_type(a) for a in arguments) + ")"


def argument_type(argument: dict[str, Any]) -> str:
    """One argument in ``iree-run-module`` spelling: ``16x?xf32``, ``i32`` (a scalar)."""
    dtype = DTYPES.get(argument["dtype"], (argument["dtype"], None))[0]
    if argument.get("scalar"):
        return argument["dtype"]
    return "x".join([*("?" if d is None else str(d) for d in argument["shape"]), dtype])


#: A scalar input: ``3``, ``-1``, ``0.5``, or typed ``i32=3`` / ``index=3`` / ``f32=0.5``.
SCALAR_INPUT_RE = re.compile(r"^(?:(?P<dtype>index|[su]?i\d+|bf16|f\d+)=)?(?P<value>[-+]?[\d.]+(?:e[-+]?\d+)?)$")


def scalar_value(text: str, argument: dict[str, Any], index: int) -> str:
    """A scalar input as the IREE tools take it (bare: ``3``), checked against the
    argument's type: an integer for ``index``/``iN``, a number for floats."""
    match = SCALAR_INPUT_RE.match(text)
    wanted = argument["dtype"]
    if match is None:
        raise InvalidInputError(f"input {index} is {text!r}, the function takes a scalar {wanted} "
                                f"(give it as --input 3 or --input {wanted}=3)")
    if match["dtype"] and match["dtype"] != wanted and not (match["dtype"].lstrip("su") == wanted.lstrip("su")):
        raise InvalidInputError(f"input {index} is {text}, the function takes a scalar {wanted} "
                                f"(give it as --input {match['value']})")
    integer = wanted == "index" or "i" in wanted
    try:
        value = int(match["value"]) if integer else float(match["value"])
    except ValueError:
        raise InvalidInputError(f"input {index} is {text}, the function takes "
                                f"{'an integer' if integer else 'a number'} ({wanted})") from None
    if integer:
        low, high = integer_range(wanted)
        if not low <= value <= high:  # the IREE tools would wrap it (i32=4294967296 ran as 0)
            raise InvalidInputError(f"input {index} is {text}, outside {wanted} ({low}..{high})")
    return str(value) if integer else repr(value)


def integer_range(element: str) -> tuple[int, int]:
    """The values an integer element type holds as the IREE tools parse them: ``siN``
    signed, ``uiN`` unsigned, a signless ``iN`` either (``index``: 64 bits)."""
    bits = 64 if element == "index" else int(re.sub(r"^[su]?i", "", element))
    if element.startswith("ui"):
        return 0, (1 << bits) - 1
    if element.startswith("si"):
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return -(1 << (bits - 1)), (1 << bits) - 1


def npy_scalar(index: int, path: Path) -> str:
    """A 0-d ``.npy`` given for a scalar argument (``--inputs-from`` writes scalars so), as text."""
    values = load_input(f"@{path}")
    if not isinstance(values, np.ndarray) or values.ndim != 0 or values.dtype.kind not in "biuf":
        shape = "x".join(map(str, getattr(values, "shape", ()))) or str(getattr(values, "dtype", "object"))
        raise InvalidInputError(f"{path}: input {index} has shape {shape}, the function takes a scalar "
                                f"(a 0-d .npy or --input 3)")
    return str(values.item() if values.dtype.kind != "b" else int(values.item()))


#: What the given inputs may take together unless ``--max-input-bytes`` says otherwise: a
#: quarter of the machine's memory (the run also holds its results, the module's buffers
#: and, in-process, a copy per call). A ``100000x100000xf32`` input into a ``?x?``
#: argument is 37 GiB: refused here, before IREE or numpy allocates it.
INPUT_MEMORY_FRACTION = 0.25


def default_input_budget() -> int:
    import os

    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * INPUT_MEMORY_FRACTION)


def element_bytes(dtype: str) -> int:
    """Bytes per element of an ``iree-run-module`` element type (``i1``: one byte)."""
    bits = int(re.sub(r"\D", "", dtype) or 8)
    return max(1, bits // 8)


def check_input_sizes(inputs: Sequence[str], budget: int | None = None) -> None:
    """The given inputs, sized from their text (shape x element size) or ``.npy`` file,
    must fit ``budget`` bytes together (default :func:`default_input_budget`): exit 2
    naming the input that passes it, before anything is allocated."""
    from dfit_mlir.core.reading import size_text

    limit = default_input_budget() if budget is None else budget
    total = 0
    for index, text in enumerate(inputs):
        match = INPUT_RE.match(text)
        if match is not None:
            size = math.prod(int(dim) for dim in match["shape"].split("x") if dim) * element_bytes(match["dtype"])
        elif text.startswith("@") and Path(text[1:]).is_file():
            size = Path(text[1:]).stat().st_size
        else:
            continue
        total += size
        if total > limit:
            shown = text if len(text) <= 60 else text[:57] + "..."
            raise InvalidInputError(f"input {index} ({shown}) is {size_text(size)}: the inputs would take {size_text(total)}, "
                                    f"over the {size_text(limit)} a run may give them (--max-input-bytes SIZE raises it)")


def check_inputs(inputs: Sequence[str], arguments: list[dict[str, Any]], budget: int | None = None) -> list[str]:
    """Inputs must fit the signature and the memory budget (:func:`check_input_sizes`; one
    line naming the input if not); returns them as the IREE tools take them (scalars
    bare: ``i32=3`` becomes ``3``)."""
    check_input_sizes(inputs, budget)
    if len(inputs) != len(arguments):
        raise InvalidInputError(f"the function takes {len(arguments)} input(s) {describe(arguments)}, "
                                f"{len(inputs)} given; give one --input per argument, in order")
    checked = []
    for index, (text, argument) in enumerate(zip(inputs, arguments, strict=True)):
        if argument.get("scalar"):
            checked.append(scalar_value(npy_scalar(index, Path(text[1:])) if text.startswith("@") else text,
                                        argument, index))
            continue
        checked.append(text)
        if text.startswith("@"):
            check_npy_input(index, Path(text[1:]), argument)
            continue
        if SCALAR_INPUT_RE.match(text) and "=" not in text:
            raise InvalidInputError(f"input {index} is the scalar {text}, the function takes a tensor "
                                    f"{argument_type(argument)} (give it as {argument_type(argument)}={text})")
        match = INPUT_RE.match(text)
        if match is None:  # what the IREE tools would fail on with exit 3
            raise InvalidInputError(f"input {index} is {text!r}: give a tensor as {argument_type(argument)}=VALUES "
                                    f"(one value, or one per element) or @file.npy")
        shape = [int(dim) for dim in match["shape"].split("x") if dim]
        wanted = [dim if dim is not None else shape[i] if i < len(shape) else None
                  for i, dim in enumerate(argument["shape"])]
        dtype = DTYPES.get(argument["dtype"], (argument["dtype"], None))[0]
        if shape != wanted or match["dtype"] != dtype:
            raise InvalidInputError(f"input {index} is {match['shape']}{match['dtype']}, "
                                    f"the function takes {argument_type(argument)}")
        if dtype == "i1":
            checked[-1] = bool_text(index, match)
        else:
            check_literal_values(index, match, shape)
    return checked


#: How the IREE tools separate the values of a ``SHAPExTYPE=v0 v1 …`` input.
VALUE_SEPARATOR = re.compile(r"[,\s\[\]]+")  # brackets too: 2x2xi32=[1 2][3 4]
INTEGER_TEXT = re.compile(r"[-+]?\d+")


def check_literal_values(index: int, match: re.Match[str], shape: list[int]) -> None:
    """The values of a ``SHAPExTYPE=…`` input: one (a splat) or one per element, each a
    number of the element type (an integer within its range for integer types) — what
    the IREE tools refuse with a toolchain failure, or silently wrap or truncate
    (``8xi32=1.5`` ran as 1)."""
    element, text = match["dtype"], match["value"].strip()
    if text.startswith("@"):  # the elements' bytes in a file (4x2xf32=@x.bin): the runtime reads them
        return
    values = [value for value in VALUE_SEPARATOR.split(text) if value]
    elements = math.prod(shape)
    if len(values) not in (1, elements):
        raise InvalidInputError(f"input {index} has {len(values)} values, a {match['shape']}{element} takes "
                                f"{elements} (or one, for every element)")
    integer = element not in ("f16", "bf16", "f32", "f64")
    for value in values:
        if integer:
            if not INTEGER_TEXT.fullmatch(value):
                raise InvalidInputError(f"input {index} holds {value!r}, not an integer ({element})")
            low, high = integer_range(element)
            if not low <= int(value) <= high:
                raise InvalidInputError(f"input {index} holds {value}, outside {element} ({low}..{high})")
            continue
        try:
            float(value)
        except ValueError:
            raise InvalidInputError(f"input {index} holds {value!r}, not a number ({element})") from None


#: The values a bool (``i1``) tensor may be written with.
BOOL_WORDS = {"0": "0", "1": "1", "false": "0", "true": "1"}


def bool_text(index: int, match: re.Match[str]) -> str:
    """A bool tensor written as text (``2x4xi1=1``, ``2x2xi1=[1 0][0 1]``, ``true``/``false``)
    in the spelling the IREE tools read right: one byte per element (``i8``), which is how
    the runtime stores ``i1``. The pinned tools parse ``i1`` text as packed bits and fail
    (``binary hex element count mismatch``); the in-process runtime takes the bytes alike."""
    words = [word for word in re.split(r"[\s,\[\]]+", match["value"]) if word]
    if not words or any(word.lower() not in BOOL_WORDS for word in words):
        raise InvalidInputError(f"input {index} is {match.group(0)!r}: a bool (i1) tensor takes 0/1 or true/false "
                                f"values (or an .npy file of numpy bools, --input @mask.npy)")
    value = re.sub(r"[A-Za-z]+", lambda word: BOOL_WORDS[word.group(0).lower()], match["value"])
    return f"{match['shape']}i8={value}"


#: Source ops that index a table with an integer tensor, and the table's operand.
GATHER_OPS = {
    "torch.aten.embedding": 0, "torch.aten.index_select": 0, "torch.aten.gather": 0, "torch.aten.take": 0,
    "onnx.Gather": 0, "onnx.GatherElements": 0, "onnx.GatherND": 0, "stablehlo.gather": 0, "mhlo.gather": 0,
    "stablehlo.torch_index_select": 0, "tosa.gather": 0, "tensor.extract": 0, "tensor.gather": 0,
}
#: Ops that read a window of their first operand at start indices given by the others
#: (JAX's ``table[token]`` with a scalar token, ``lax.dynamic_index_in_dim``).
DYNAMIC_SLICE_OPS = frozenset({"stablehlo.dynamic_slice", "mhlo.dynamic_slice"})
#: Op name fragments that pass an integer tensor on unchanged in value (casts, shape ops).
PASS_THROUGH = ("cast", "convert", "reshape", "view", "squeeze", "expand", "broadcast", "slice", "transpose",
                "to.dtype", "flatten", "clone", "contiguous", "collapse", "tosa.identity", "extsi", "trunci",
                # Index normalisation before a gather: JAX's ``select(i < 0, i + n, i)`` (the
                # index itself is select's false operand), ``clip`` and ``mode="wrap"``
                # (remainder), ONNX/torch ``Where``/``Clip``: an index in range stays as it is.
                "select", "clamp", "clip", "where", "remainder", "remsi", "remui", "minimum", "maximum",
                "minsi", "maxsi")


@dataclass(frozen=True)
class InputPlan:
    """How a default input is made: ``random-normal`` (floats), ``all-true`` (bools: a
    mask keeps every position; ``reason`` says so), ``integers-below`` (``bound``: a table
    the input indexes, named by ``reason``), ``zeros`` (integers that index nothing the
    manifest shows). ``shape``: the size used, dynamic dims
    included (as 1); ``dynamic``: how to choose them, when the argument has any."""

    made: str
    bound: int | None = None
    reason: str | None = None
    shape: tuple[int, ...] | None = None
    dynamic: str | None = None

    def summary_entry(self, argument: dict[str, Any], text: str) -> dict[str, Any]:
        """The argument's line in ``summary.json``'s ``inputs``: the shape *used*
        (``declared_shape`` keeps ``null`` for a dynamic dim), how it was made, why."""
        entry: dict[str, Any] = {"shape": argument["shape"], "dtype": argument["dtype"]}
        if argument.get("scalar"):
            entry.update(scalar=True, value=text)
        if self.shape is not None and list(self.shape) != list(argument["shape"]):
            entry.update(shape=list(self.shape), declared_shape=argument["shape"])
        entry["made"] = self.made
        for key in ("bound", "reason", "dynamic"):
            if getattr(self, key) is not None:
                entry[key] = getattr(self, key)
        return entry


#: Comparisons that make a one-hot against an iota (JAX's ``one_hot``).
COMPARE_OPS = ("stablehlo.compare", "mhlo.compare", "arith.cmpi", "onnx.Equal", "torch.aten.eq.Tensor", "tosa.equal")
CALL_OPS = ("func.call", "util.call")
RETURN_OPS = ("func.return", "util.return")


@dataclass(frozen=True, slots=True)
class IndexUse:
    """One place an integer input indexes something: ``bound``, below which a made-up
    index is valid (a gather's smallest table dim, an embedding's rows, a one-hot's
    length); ``size``, at or past which a given index is outside the table for certain
    (an embedding's rows, a gather's largest table dim; ``None`` for a one-hot, where an
    index out of range is a row of zeros, not a fault)."""

    bound: int
    size: int | None
    reason: str


def integer_bounds(manifest: dict[str, Any] | None, function: str) -> dict[int, tuple[int, str]]:
    """Argument index -> (exclusive bound, why) for integer inputs that reach a gather,
    embedding or one-hot through casts, shape ops, index normalisation (select, clamp,
    remainder) and calls: the smallest dimension of every table they index (an
    embedding: its row count), or the length of the iota a one-hot compares them with."""
    return {index: min((use.bound, use.reason) for use in uses)
            for index, uses in index_uses(manifest, function).items()}


def check_indices(inputs: Sequence[str], manifest: dict[str, Any] | None, function: str) -> None:
    """A given integer input that indexes a table must lie inside it: one line naming the
    input, the value, the op and the table's size if not (a module would read past the
    table, or fault)."""
    for index, uses in index_uses(manifest, function).items():
        sized = [use for use in uses if use.size is not None]
        if not sized or index >= len(inputs):
            continue
        tightest = min(sized, key=lambda use: use.size or 0)
        values = _integer_values(inputs[index])
        if values is None or values.size == 0:
            continue
        largest, smallest = int(values.max()), int(values.min())
        negative_ok = "select" in tightest.reason or smallest >= 0
        if largest >= (tightest.size or 0) or (not negative_ok and smallest < 0):
            bad = largest if largest >= (tightest.size or 0) else smallest
            raise InvalidInputError(f"input {index} holds the index {bad}, outside the table: {tightest.reason} "
                                    f"(valid indices 0..{(tightest.size or 0) - 1})")


def _integer_values(text: str) -> np.ndarray | None:
    """The integers of an input (``@x.npy``, a splat, or ``1x4xi64=3,1,4,1``); ``None``
    for any other form, which the runtime checks."""
    match = INPUT_RE.match(text)
    if match is not None and re.fullmatch(r"[-+]?\d+(?:[,\s]+[-+]?\d+)+", match["value"].strip()):
        return np.array([int(v) for v in re.split(r"[,\s]+", match["value"].strip())])
    try:
        values = load_input(text)
    except InvalidInputError:
        return None
    if not isinstance(values, np.ndarray) or values.dtype.kind not in "iub":
        return None
    return values


def index_uses(manifest: dict[str, Any] | None, function: str) -> dict[int, list[IndexUse]]:
    """Argument index -> every :class:`IndexUse` of that integer input (see
    :func:`integer_bounds` for what it follows)."""
    if not manifest:
        return {}
    graph = _IndexGraph(manifest)
    bounds: dict[int, list[IndexUse]] = {}
    for argument in signature(manifest, function):
        if argument["dtype"] not in DTYPES or np.dtype(DTYPES[argument["dtype"]][1]).kind == "f":
            continue
        found = graph.uses_of(argument)
        if found:
            bounds[int(argument["id"].rsplit("arg", 1)[1])] = found
    return bounds


#: A value the walk of :class:`_IndexGraph` reached: (tensor, reached through a select,
#: so negatives wrap; the calls whose callee it is in, innermost last).
_Reached = tuple[dict[str, Any], bool, tuple[str, ...]]


class _IndexGraph:
    """The manifest's operators and tensors, walked from an integer input to the tables
    it indexes (:func:`integer_bounds`)."""

    def __init__(self, manifest: dict[str, Any]):
        self.operators = {op["id"]: op for op in manifest.get("operators", [])}
        tensors = manifest.get("tensors", [])
        self.results: dict[str, list[dict[str, Any]]] = {}
        self.feeding: dict[str, list[dict[str, Any]]] = {}
        for tensor in tensors:
            self.results.setdefault(tensor["producer"], []).append(tensor)
            for consumer in tensor.get("consumers", ()):
                self.feeding.setdefault(consumer, []).append(tensor)
        self.by_id = {tensor["id"]: tensor for tensor in tensors}
        self.functions = [op["id"] for op in self.operators.values()
                          if op.get("parent") is None and "func" in op.get("op", "")]

    def uses_of(self, argument: dict[str, Any]) -> list[IndexUse]:
        seen: set[str] = set()
        frontier: list[_Reached] = [(argument, False, ())]
        found: list[IndexUse] = []
        while frontier:
            tensor, via_select, returns = frontier.pop()
            for consumer in tensor.get("consumers", ()):
                if consumer in seen or consumer not in self.operators:
                    continue
                seen.add(consumer)
                use, passed = self.follow(consumer, tensor, via_select, returns)
                found.extend([use] if use is not None else [])
                frontier.extend(passed)
        return found

    def follow(self, consumer: str, tensor: dict[str, Any], via_select: bool,
               returns: tuple[str, ...]) -> tuple[IndexUse | None, list[_Reached]]:
        """What ``consumer`` does with the integer ``tensor``: index a table (the use),
        or pass it on (the values it becomes); a helper's result goes back to its call."""
        op = self.operators[consumer]
        if op["op"] in GATHER_OPS:
            return _gather_use(consumer, op, tensor, via_select), []
        if op["op"] in COMPARE_OPS:
            length = self.iota_length(consumer)
            return (IndexUse(length, None, f"{consumer} compares it with a {length}-long iota (one-hot)")
                    if length else None), []
        if op["op"] in DYNAMIC_SLICE_OPS and tensor.get("shape") != (op.get("operands") or [{}])[0].get("shape"):
            return _window_start_use(consumer, op, via_select), []
        if op.get("carried"):  # into a loop: the loop state it becomes, inside
            return None, [({"id": state["id"], "consumers": state["consumers"], "shape": tensor.get("shape"),
                            "dtype": tensor.get("dtype")}, via_select, returns)
                          for state in op["carried"] if state["operand"] == tensor["id"]]
        if op["op"] in CALL_OPS:
            return None, [(a, via_select, (*returns, consumer)) for a in self.callee_arguments(op, tensor)]
        if op["op"] in RETURN_OPS and returns:  # a helper (``remainder``, ``_where``) hands it back
            return None, [(result, via_select, returns[:-1]) for result in self.results.get(returns[-1], ())]
        if any(fragment in op["op"] for fragment in PASS_THROUGH):
            wraps = via_select or "select" in op["op"] or "where" in op["op"].lower()
            return None, [(result, wraps, returns) for result in self.results.get(consumer, ())]
        return None, []

    def enclosing_function(self, op: dict[str, Any]) -> str:
        while op.get("parent") is not None and op["parent"] in self.operators:
            op = self.operators[op["parent"]]
        return op["id"]

    def callee_arguments(self, call: dict[str, Any], tensor: dict[str, Any]) -> list[dict[str, Any]]:
        """The callee's argument tensors ``tensor`` is passed as: the callee is the one
        function whose argument types match the call's operands (calls keep no name),
        other than the caller (StableHLO functions do not recurse; ``jit(f)`` of a
        function with main's own signature calls it)."""
        wanted = [(o.get("shape"), o.get("dtype")) for o in call.get("operands") or []]
        matches = []
        caller = self.enclosing_function(call)
        for name in self.functions:
            if name == caller:
                continue
            arguments = [self.by_id.get(f"{name}/arg{i}") for i in range(len(wanted))]
            if all(arguments) and self.by_id.get(f"{name}/arg{len(wanted)}") is None and \
                    [(a["shape"], a["dtype"]) for a in arguments] == wanted:  # type: ignore[index]
                matches.append(arguments)
        if len(matches) != 1:
            return []
        return [a for a in matches[0] if (a["shape"], a["dtype"]) == (tensor.get("shape"), tensor.get("dtype"))]

    def iota_length(self, compare: str) -> int | None:
        for other in self.feeding.get(compare, ()):
            current = other
            for _ in range(4):
                producer = self.operators.get(current.get("producer", ""))
                if producer is None:
                    break
                if "iota" in producer["op"]:
                    dims = [d for d in current.get("shape") or [] if d and d != 1]
                    return max(dims) if dims else None
                upstream = self.feeding.get(producer["id"], [])
                if len(upstream) != 1:
                    break
                current = upstream[0]
        return None


def _gather_use(consumer: str, op: dict[str, Any], tensor: dict[str, Any], via_select: bool) -> IndexUse | None:
    """A gather's index: below its table's smallest dimension (an embedding: its rows)."""
    table = (op.get("operands") or [{}])[GATHER_OPS[op["op"]]]
    shape = table.get("shape") or []
    if not shape or table.get("shape") == tensor.get("shape") or not all(d for d in shape):
        return None
    embedding = op["op"] == "torch.aten.embedding"
    rows = shape[0] if embedding else min(shape)
    return IndexUse(rows, shape[0] if embedding else max(shape),
                    f"{consumer} indexes a {'x'.join(map(str, shape))} table"
                    + (" (through a select)" if via_select else ""))


def _window_start_use(consumer: str, op: dict[str, Any], via_select: bool) -> IndexUse | None:
    """The start index of a dynamic slice: below ``dim - window + 1`` along the axes
    the window moves on (where it is narrower than the table; the smallest such bound
    when there are several, as the start operands are alike); ``None`` when the
    window spans the whole table."""
    operands = op.get("operands") or []
    table = (operands[0] if operands else {}).get("shape") or []
    window = ((op.get("results") or [{}])[0]).get("shape") or []
    if len(table) != len(window) or not all(table) or not all(window):
        return None
    moving = [dim - size + 1 for dim, size in zip(table, window, strict=True) if size < dim]
    if not moving:
        return None
    starts = min(moving)
    return IndexUse(starts, starts, f"{consumer} reads a {'x'.join(map(str, window))} window of a "
                                    f"{'x'.join(map(str, table))} table" + (" (through a select)" if via_select else ""))


def _array_spec(argument: dict[str, Any], purpose: str) -> tuple[np.dtype, list[int]]:
    """The numpy dtype and shape (dynamic dims as 1) of a tensor argument's made-up input."""
    if argument["dtype"] not in DTYPES:
        raise InvalidInputError(f"cannot make a {purpose} input of dtype {argument['dtype']}; give --input")
    return np.dtype(DTYPES[argument["dtype"]][1]), [dim or 1 for dim in argument["shape"]]


def _saved_input(workdir: Path, index: int, values: np.ndarray) -> str:
    """``values`` saved as ``input{index}.npy`` in ``workdir``, as an ``@file`` input."""
    path = workdir / f"input{index}.npy"
    np.save(path, values)
    return f"@{path}"


def default_inputs(arguments: list[dict[str, Any]], workdir: Path, *, manifest: dict[str, Any] | None = None,
                   function: str | None = None, seed: int = 0) -> tuple[list[str], list[InputPlan]]:
    """``@file.npy`` inputs a model can take (dynamic dims as 1): floats random normal;
    bools all true (:data:`BOOL_REASON`); integers below the bound of the table they index
    (:func:`integer_bounds`), else 0 — random integers index outside every table and crash
    the module."""
    bounds = integer_bounds(manifest, function) if function else {}
    generator = np.random.default_rng(seed)
    inputs, plans = [], []
    for index, argument in enumerate(arguments):
        if argument.get("scalar"):
            value, plan = default_scalar(argument)
            inputs.append(value)
            plans.append(plan)
            continue
        dtype, shape = _array_spec(argument, "default")
        dynamic = dynamic_note(index, argument, shape)
        if dtype.kind == "f":
            values, plan = generator.standard_normal(shape).astype(dtype), InputPlan("random-normal")
        elif dtype.kind == "b":
            values, plan = np.ones(shape, dtype=dtype), InputPlan("all-true", reason=BOOL_REASON.format(index=index))
        elif index in bounds:
            bound, reason = bounds[index]
            values = generator.integers(0, bound, size=shape, dtype=dtype)
            plan = InputPlan("integers-below", bound, reason)
        else:
            values, plan = np.zeros(shape, dtype=dtype), InputPlan("zeros")
        inputs.append(_saved_input(workdir, index, values))
        plans.append(replace(plan, shape=tuple(shape), dynamic=dynamic))
    return inputs, plans


#: Why a bool input defaults to all true: a bool input is mostly an attention mask, and
#: an all-false mask masks every position: softmax over nothing, a NaN output.
BOOL_REASON = ("input {index} is bool (a mask, most likely): all true, every position kept (all false would "
               "mask every position and give NaN); give --input to choose")


def dynamic_note(index: int, argument: dict[str, Any], shape: list[int]) -> str | None:
    """``input 0 (?x64xi64) has a dynamic dimension: ran with 1x64; ...`` for an argument
    with dynamic dims (made up as 1), else ``None``."""
    if all(dim is not None for dim in argument["shape"]):
        return None
    used = "x".join(map(str, shape))
    element = DTYPES.get(argument["dtype"], (argument["dtype"], None))[0]
    return (f"input {index} ({argument_type(argument)}) has a dynamic dimension: ran with {used}; "
            f"choose the size with --input {used}x{element}=VALUE or --input @file.npy")


def default_scalar(argument: dict[str, Any]) -> tuple[str, InputPlan]:
    """A scalar argument's default: 1. Integer scalars are mostly trip counts, sizes and
    indices: 1 runs a loop once and indexes the first row; 0 would skip the work that
    is to be measured, and a random value could index outside a table."""
    if argument["dtype"] == "index" or "i" in argument["dtype"]:
        return "1", InputPlan("scalar-one", reason=f"integer scalar ({argument['dtype']}): 1, as a trip count or "
                                                   f"index that runs the work once; give --input to choose")
    return "1.0", InputPlan("scalar-one", reason=f"float scalar ({argument['dtype']}): 1.0; give --input to choose")


def random_inputs(arguments: list[dict[str, Any]], workdir: Path, seed: int = 0) -> list[str]:
    """``@file.npy`` inputs with random values for the signature (dynamic dims as 1)."""
    generator = np.random.default_rng(seed)
    inputs = []
    for index, argument in enumerate(arguments):
        if argument.get("scalar"):
            inputs.append(default_scalar(argument)[0])
            continue
        dtype, shape = _array_spec(argument, "random")
        if dtype.kind == "f":
            values = generator.standard_normal(shape).astype(dtype)
        else:
            info = np.iinfo(dtype)
            values = generator.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
        inputs.append(_saved_input(workdir, index, values))
    return inputs


def splat_inputs(arguments: list[dict[str, Any]], value: float = 1) -> list[str]:
    """``SHAPExDTYPE=value`` inputs for the signature (dynamic dims as 1)."""
    return [default_scalar(a)[0] if a.get("scalar") else
            "x".join(str(dim or 1) for dim in a["shape"]) + f"x{DTYPES[a['dtype']][0]}={value}" for a in arguments]


def inputs_from(directory: Path) -> list[str]:
    """Every ``*.npy`` in ``directory``, in name order, as ``@file`` inputs."""
    if not directory.is_dir():
        raise InvalidInputError(f"{directory}: no such directory")
    files = sorted(directory.glob("*.npy"))
    if not files:
        raise InvalidInputError(f"{directory}: no .npy inputs in it")
    return [f"@{path}" for path in files]


def load_input(text: str) -> np.ndarray | int | float:
    """An input in ``iree-run-module`` form: ``@x.npy``, ``2x3xf32=0.5`` (a splat), or a
    bare scalar (``3``, ``0.5``: a Python int or float, as the runtime takes scalars)."""
    scalar = SCALAR_INPUT_RE.match(text)
    if scalar is not None and scalar["dtype"] is None:
        return int(text) if re.fullmatch(r"[-+]?\d+", text) else float(text)
    if text.startswith("@"):
        path = Path(text[1:])
        _require_regular(path, None)
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


#: ``.npy`` format versions IREE's ``@file`` reader takes.
NPY_VERSIONS = ((1, 0), (2, 0))


def _require_regular(path: Path, index: int | None) -> None:
    """An ``@file`` input must be a regular file: opening a FIFO would wait for a writer
    forever, a device would be read without end."""
    import stat

    which = "" if index is None else f" (input {index})"
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise InvalidInputError(f"{path}: no such file{which}") from None
    except OSError as error:
        raise InvalidInputError(f"{path}: {error.strerror or error}{which}") from None
    if stat.S_ISDIR(mode):
        raise InvalidInputError(f"{path}: is a directory, not an .npy file{which}")
    if not stat.S_ISREG(mode):
        raise InvalidInputError(f"{path}: not a regular file (a FIFO, socket or device), not an .npy file{which}")


def check_npy_input(index: int, path: Path, argument: dict[str, Any]) -> None:
    """An ``@file.npy`` input must be a readable array of the argument's shape and dtype
    (read from the header only: a large input is not loaded twice)."""
    _require_regular(path, index)
    try:
        with open(path, "rb") as handle:
            version = np.lib.format.read_magic(handle)
            if version not in NPY_VERSIONS:
                raise ValueError(f"npy format version {version[0]}.{version[1]}; IREE reads 1.0 and 2.0")
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, fortran_order, dtype = read_header(handle)
    except FileNotFoundError:
        raise InvalidInputError(f"{path}: no such file (input {index})") from None
    except IsADirectoryError:
        raise InvalidInputError(f"{path}: is a directory, not an .npy file (input {index})") from None
    except Exception as error:  # noqa: BLE001 — numpy's header parser raises what its tokenizer does
        reason = str(error).splitlines()[0][:160] if str(error) else type(error).__name__
        raise InvalidInputError(f"{path}: not a readable .npy file (input {index}: {reason})") from None
    if any(dim < 0 for dim in shape):
        raise InvalidInputError(f"{path}: not a readable .npy file (input {index}: negative dimension in {shape})")
    if dtype.hasobject:
        raise InvalidInputError(f"{path}: holds Python objects (a pickled array), not numbers (input {index})")
    if fortran_order and len(shape) > 1:
        raise InvalidInputError(f"{path}: a Fortran-order array, which IREE's .npy reader does not take (input "
                                f"{index}; save np.ascontiguousarray of it)")
    expected_bytes = math.prod(int(dim) for dim in shape) * dtype.itemsize  # Python ints: no overflow
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
