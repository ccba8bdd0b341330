"""Static cost of an op from its name and operand/result types: MACs, FLOPs and bytes.

Only what the types determine is derived; anything else is left as ``None`` (unknown),
never guessed. Conventions: one MAC = one multiply + one add = 2 FLOPs; elementwise and
reduction ops count one FLOP per element they produce (elementwise) or read (reduction);
bytes are the static sizes of every tensor operand and result.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from typing import Sequence

_TENSOR_RE = re.compile(r"^(?:tensor|memref)<(?P<body>.*)>$")
_VTENSOR_RE = re.compile(r"^!torch\.vtensor<\[(?P<dims>[^\]]*)\],(?P<dtype>.+)>$")
_QUANT_STORAGE_RE = re.compile(r"^!quant\.(?:uniform|calibrated|any)<(?P<storage>[a-z]+\d+)")
_BITS_RE = re.compile(r"^(?:[suf]?i|f|bf|ui|si)(?P<bits>\d+)$")

_DTYPE_BITS = {"bf16": 16, "f16": 16, "f32": 32, "f64": 64, "i1": 8, "index": 64, "tf32": 32}


@dataclass(frozen=True, slots=True)
class ShapedType:
    """A ranked shaped type; ``None`` dims are dynamic."""

    shape: tuple[int | None, ...]
    dtype: str
    # Derived once: the cost rules ask for them many times per op.
    static: bool = field(init=False, compare=False)
    elements: int | None = field(init=False, compare=False)

    def __post_init__(self) -> None:
        static = all(dim is not None for dim in self.shape)
        object.__setattr__(self, "static", static)
        object.__setattr__(self, "elements", math.prod(self.shape) if static else None)  # type: ignore[arg-type]

    @property
    def nbytes(self) -> int | None:
        bits = dtype_bits(self.dtype)
        if bits is None or self.elements is None:
            return None
        return (self.elements * bits + 7) // 8


@functools.lru_cache(maxsize=8192)
def type_bytes(type_text: str) -> int | None:
    """Static size of a shaped type's data, or None (not shaped, dynamic, unknown dtype)."""
    shaped = parse_shaped(type_text)
    return None if shaped is None else shaped.nbytes


def dtype_bits(dtype: str) -> int | None:
    if dtype in _DTYPE_BITS:
        return _DTYPE_BITS[dtype]
    quant = _QUANT_STORAGE_RE.match(dtype)
    if quant:
        dtype = quant.group("storage")
    match = _BITS_RE.match(dtype)
    if match:
        return max(8, int(match.group("bits")))  # sub-byte types are stored in bytes
    return None


@functools.lru_cache(maxsize=8192)
def parse_shaped(type_text: str) -> ShapedType | None:
    """``tensor<1x3xf32>``, ``memref<4xi8>``, ``!torch.vtensor<[1,3],f32>``; else None.
    Cached: a model has few distinct types and many values of each."""
    type_text = type_text.strip()
    match = _TENSOR_RE.match(type_text)
    if match:
        body = _strip_encoding(match.group("body"))
        if body.startswith("*"):
            return None
        parts = _split_dims(body)
        dims = tuple(None if part == "?" else int(part) for part in parts[:-1])
        return ShapedType(dims, parts[-1])
    match = _VTENSOR_RE.match(type_text)
    if match:
        dims_text = match.group("dims").strip()
        dims = tuple(
            None if d.strip() in ("?", "-1") else int(d) for d in dims_text.split(",") if d.strip()
        )
        return ShapedType(dims, match.group("dtype").strip())
    return None


def _strip_encoding(body: str) -> str:
    """Drop a trailing ``, #encoding`` / layout at bracket depth 0."""
    depth = 0
    for index, char in enumerate(body):
        if char in "<([{":
            depth += 1
        elif char in ">)]}":
            depth -= 1
        elif char == "," and depth == 0:
            return body[:index]
    return body


def _split_dims(body: str) -> list[str]:
    """Split ``1x?x3x!quant.uniform<i8:f32, 0.1>`` into dims and the element type."""
    parts: list[str] = []
    rest = body
    while True:
        match = re.match(r"^(\d+|\?)x", rest)
        if not match:
            parts.append(rest)
            return parts
        parts.append(match.group(1))
        rest = rest[match.end() :]


@dataclass(frozen=True, slots=True)
class Cost:
    macs: int | None
    flops: int | None
    bytes: int | None


#: ONNX ops (as the importer names them) with the rule of their equivalent.
_ONNX_EQUIVALENT = {"onnx.Conv": "torch.aten.conv2d", "onnx.MatMul": "linalg.matmul", "onnx.Gemm": "linalg.matmul"}

_ELEMENTWISE_SUFFIXES = frozenset(
    "add sub mul div addf subf mulf divf addi subi muli maximumf minimumf maxsi minsi "
    "maximum minimum negate negf exp log tanh sigmoid logistic rsqrt sqrt abs absf pow "
    "relu clamp select erf reciprocal floor ceil cmpf cmpi and or xor max min rescale cast "
    "truncf extf sitofp fptosi mul_scalar add_scalar "
    # StableHLO spells the arithmetic out (stablehlo.multiply, not .mul).
    "subtract multiply divide exponential power remainder sine cosine gelu silu".split()
)


def _elementwise_kind(name: str) -> str:
    """The kind an op name says, for the elementwise rule: its last segment, except
    that torch ops carry an overload after it (``torch.aten.add.Tensor`` → ``add``)."""
    if name.startswith(("torch.aten.", "torch.prims.")):
        return name.split(".")[2]
    return name.rsplit(".", 1)[-1]


def op_cost(name: str, operands: Sequence[str], results: Sequence[str], body_ops: int = 0,
            iteration_space: int | None = None, reduction: bool = False,
            contraction: int | None = None) -> Cost:
    """Cost of one op. ``body_ops`` and ``iteration_space`` describe a ``linalg.generic``
    (arith ops in its body, product of its loop bounds) when the engine can tell;
    ``contraction`` is the contracted length of a ``dot_general`` (from its attribute).
    ONNX ops imported as ``torch.operator "onnx.Conv"`` are passed by their ONNX name."""
    ins = [parse_shaped(text) for text in operands]
    outs = [parse_shaped(text) for text in results]
    tensor_bytes = [type_bytes(text) for text in (*operands, *results) if parse_shaped(text) is not None]
    nbytes = sum(tensor_bytes) if tensor_bytes and None not in tensor_bytes else None  # type: ignore[arg-type]
    if name.startswith("onnx."):
        name = _ONNX_EQUIVALENT.get(name, name.lower())
    macs = _macs(name, ins, outs)
    if macs is None and contraction is not None and outs and outs[0] is not None and outs[0].static:
        macs = (outs[0].elements or 0) * contraction
    if macs is None and iteration_space is not None and reduction and body_ops >= 2:
        macs = iteration_space  # mul + add body over a reduction loop nest
    if macs is not None:
        return Cost(macs, 2 * macs, nbytes)
    flops = None
    if iteration_space is not None and body_ops:
        flops = iteration_space * body_ops
    elif _is_reduction(name) and ins and ins[0] is not None:
        flops = ins[0].elements
    elif _is_pool(name) and not _is_reduction(name) and outs and outs[0] is not None and len(ins) > 1 and ins[1] is not None:
        window = ins[1].elements
        flops = outs[0].elements * window if outs[0].elements and window else None
    elif _elementwise_kind(name) in _ELEMENTWISE_SUFFIXES and outs and outs[0] is not None:
        flops = outs[0].elements
    return Cost(None, flops, nbytes)


def _is_reduction(name: str) -> bool:
    return (name.endswith(("reduce", "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "argmax", "softmax"))
            or ".reduce" in name or name.endswith("globalaveragepool"))


def _is_pool(name: str) -> bool:
    return "pool" in name


def _macs(name: str, ins: list[ShapedType | None], outs: list[ShapedType | None]) -> int | None:
    out = outs[0] if outs else None
    if out is None or not out.static:
        return None
    suffix = name.split(".", 1)[-1]
    lhs = ins[0] if ins else None
    rhs = ins[1] if len(ins) > 1 else None
    if lhs is None or rhs is None or not lhs.static or not rhs.static:
        return None
    out_elems = out.elements or 0
    # Matrix products: output elements x contraction length (last dim of lhs).
    if suffix in {"matmul", "batch_matmul", "matmul_transpose_b", "batch_matmul_transpose_b",
                  "matvec", "vecmat", "batch_matvec", "mm", "bmm", "aten.mm", "aten.bmm",
                  "aten.matmul", "dot", "dot_general"}:
        if suffix == "dot_general":
            return None  # contraction dims live in an attribute; handled by the engine
        if suffix in {"matmul", "aten.matmul", "batch_matmul"} and name.startswith("tosa."):
            return out_elems * lhs.shape[-1]  # tosa.matmul [N,H,C] x [N,C,W]
        return out_elems * lhs.shape[-1]
    if suffix in {"fully_connected", "aten.linear"}:
        return out_elems * lhs.shape[-1]
    # Convolutions: output elements x reduction volume of one output element.
    if name.startswith("linalg.conv_") or name.startswith("linalg.depthwise_conv"):
        layout = suffix.rsplit("_", 1)[-1]  # hwcf, fchw, hwc, hwcm, ...
        if "depthwise" in suffix:
            spatial = rhs.shape[: len(rhs.shape) - (2 if layout.endswith("m") else 1)]
            if layout.startswith("c"):
                spatial = rhs.shape[1:]
            return out_elems * math.prod(spatial)  # type: ignore[arg-type]
        if layout.endswith("f"):  # ...hwcf: filter [kh, kw, c, f]
            return out_elems * math.prod(rhs.shape[:-1])  # type: ignore[arg-type]
        if layout.startswith("f"):  # fchw: filter [f, c, kh, kw]
            return out_elems * math.prod(rhs.shape[1:])  # type: ignore[arg-type]
        return out_elems * math.prod(rhs.shape)  # type: ignore[arg-type]  # 1-D conv_1d etc.
    if name in {"tosa.conv2d", "tosa.conv3d", "tosa.transpose_conv2d"}:
        return out_elems * math.prod(rhs.shape[1:])  # type: ignore[arg-type]  # [O, KH, KW, I]
    if name == "tosa.depthwise_conv2d":
        return out_elems * rhs.shape[0] * rhs.shape[1]  # type: ignore[operator]  # [KH, KW, C, M]
    if name in {"torch.aten.conv2d", "torch.aten.convolution", "torch.aten._convolution"}:
        return out_elems * math.prod(rhs.shape[1:])  # type: ignore[arg-type]  # [O, I/g, KH, KW]
    if name == "stablehlo.convolution":
        return out_elems * (rhs.elements or 0) // max(1, out.shape[-1] or 1)  # HWIO kernel
    return None
