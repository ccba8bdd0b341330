"""Static cost of an op from its name, operand/result types and attributes: MACs, FLOPs
and bytes. This docstring is the spec; every figure dfit prints starts here.

Only what the types and attributes determine is derived; anything else is ``None``
(unknown), never guessed. :class:`Cost` also says what *kind* of work the op does
(``contraction``, ``arithmetic``, ``data``, ``unknown``).

Conventions, per execution of the op (inside a loop: per trip, see ``trips`` in
``passes/operators.py``):

* **MAC** = one multiply + one add = **2 FLOPs**. Contractions count their MACs and
  ``flops = 2 * macs``; a bias or residual added by the same op (``addmm``, ``baddbmm``,
  ``linear``, ``onnx.Gemm``/``onnx.Conv`` with a bias) is not counted, as
  ``torch.utils.flop_counter.FlopCounterMode`` does not count it.
  - matrix products (``mm``, ``bmm``, ``matmul``, ``addmm``, ``baddbmm``, ``linear``,
    ``linalg.*matmul*``, ``tosa.matmul``, ``onnx.MatMul``/``Gemm``): output elements x
    contracted length; ``stablehlo.dot_general``: output elements x the product of the
    lhs contracting dims; ``einsum``: the product of every index size of the equation
    (two operands);
  - attention (``scaled_dot_product_attention``, ``iree_linalg_ext.attention``): the two
    products ``Q·Kᵀ`` and ``P·V``: batch x L x S x (E + Ev); the softmax between them is
    not counted (FlopCounterMode does not either);
  - convolutions: output elements x (input channels / groups x kernel window);
    transposed convolutions: *input* elements x (output channels / groups x kernel
    window), the multiplies a direct implementation does (FlopCounterMode's rule), not
    the zero-inserted convolution a compiler may run instead;
  - a ``linalg.generic`` with a reduction loop whose body multiplies and accumulates:
    one MAC per point of its iteration domain.
* **Arithmetic** (no MACs): elementwise ops 1 FLOP per output element; reductions 1
  FLOP per input element; pooling output elements x window; softmax 4 FLOPs per element
  (max, subtract, sum, divide) and 1 transcendental (its exp); layer/group/instance/RMS
  norm 5 FLOPs per element (+2 with an affine weight and bias), batch norm 4 per
  element; any other structured op (``linalg.generic`` and named elementwise/reduction
  ops): iteration domain x ``arith``/``math`` ops of its body, its transcendental
  ``math`` ops counted as transcendentals, the others as FLOPs.
* **Transcendentals** (``Cost.transcendentals``), as XLA's ``HloCostAnalysis`` counts
  them: an elementwise evaluation of ``exp``, ``expm1``, ``log``, ``log1p``, ``tanh``,
  ``logistic`` (``sigmoid``), ``sqrt``, ``rsqrt``, ``cbrt``, ``pow``, ``sin``, ``cos``,
  ``tan``, ``atan2``, ``erf`` (and ``exp2``/``log2``) is 1 transcendental per output
  element and **no FLOP**: such an op has ``flops`` 0. An activation that is arithmetic
  around a transcendental keeps its 1 FLOP per element and adds its transcendentals
  (:data:`COMPOSITE_TRANSCENDENTALS`: ``gelu`` 1 (erf or tanh), ``silu`` 1, ``softplus``
  2, ``mish`` 3, ...). A contraction, data movement or an op no rule knows has ``None``.
  Once per row (a norm's ``rsqrt`` of the variance) is not counted.
* **Data movement** (``view``, ``transpose``, ``cat``, ``slice``, gather/embedding,
  copies, broadcasts, pack/unpack, encodings): no MACs or FLOPs (``None``), only bytes.
* **Bytes** of an op: the static sizes of every tensor operand and result. Bytes of a
  *dispatch* are what crosses its boundary (``passes/region_costs.py``), not the sum of
  its ops.
* Frontends are told apart by op name only: ONNX ops imported as ``torch.operator
  "onnx.Conv"`` are passed by their ONNX name and take the rule of their torch or linalg
  equivalent; torch scalar/list operands (``groups``, ``transposed``, kernel sizes, the
  einsum equation) come in ``constants``, StableHLO/TOSA attributes in ``attributes``.

What the independent counters count, for comparing like with like
(``tests/test_costs_independent.py``): FlopCounterMode counts ``2 * MACs`` of matmuls,
convolutions and attention, nothing else; XLA's ``cost_analysis()`` counts
``flops`` (2 per MAC, 1 per elementwise/reduction element) and ``transcendentals``
apart (dfit's ``flops`` and ``transcendentals`` compare with each), and a loop body once; ``onnx-tool`` counts a Conv/Gemm's bias adds as MACs
(one per output element), which the comparison takes off.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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
    #: ``shape`` when every dim is static, else None.
    static_shape: tuple[int, ...] | None = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        known = tuple(dim for dim in self.shape if dim is not None)
        static = len(known) == len(self.shape)
        object.__setattr__(self, "static", static)
        object.__setattr__(self, "static_shape", known if static else None)
        object.__setattr__(self, "elements", math.prod(known) if static else None)

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


#: What an op does: how its cost is placed over the dispatches that name it
#: (:mod:`dfit_mlir.core.site_costs`) and what a reader is told.
CONTRACTION, ARITHMETIC, DATA, UNKNOWN = "contraction", "arithmetic", "data", "unknown"


@dataclass(frozen=True, slots=True)
class Cost:
    macs: int | None
    flops: int | None
    bytes: int | None
    kind: str = UNKNOWN
    #: Elementwise transcendental evaluations (module doc), not counted in ``flops``.
    transcendentals: int | None = None


@dataclass(frozen=True, slots=True)
class _Op:
    """What a rule sees of one op."""

    key: str  # the name the rules are keyed by (:func:`rule_key`)
    ins: list[ShapedType | None]
    outs: list[ShapedType | None]
    constants: Sequence[Any]
    attributes: Mapping[str, str]

    def static(self, *indices: int) -> bool:
        return all(self.shape(i) is not None for i in indices)

    def shape(self, index: int) -> tuple[int, ...] | None:
        """The dims of operand ``index``; None when it is missing, not shaped or dynamic."""
        shaped = self.ins[index] if index < len(self.ins) else None
        return shaped.static_shape if shaped is not None else None

    def elements(self, index: int) -> int | None:
        """Elements of operand ``index``; None when it is missing, not shaped or dynamic."""
        shaped = self.ins[index] if index < len(self.ins) else None
        return shaped.elements if shaped is not None else None

    @property
    def out(self) -> ShapedType | None:
        out = self.outs[0] if self.outs else None
        return out if out is not None and out.static else None

    @property
    def out_elements(self) -> int | None:
        """Elements of the first result; None exactly when :attr:`out` is."""
        out = self.out
        return out.elements if out is not None else None

    def constant(self, index: int) -> Any:
        return self.constants[index] if index < len(self.constants) else None


def rule_key(name: str) -> str:
    """``torch.aten.add.Tensor`` → ``aten.add`` (torch ops carry an overload after the
    name), ``onnx.Conv`` → ``onnx.conv``; any other name as it is."""
    if name.startswith(("torch.aten.", "torch.prims.")):
        return "aten." + name.split(".")[2]
    if name.startswith("onnx."):
        return name.lower()
    return name


# --- contractions: MACs --------------------------------------------------------------------


def _dim(shape: tuple[int, ...], index: int) -> int:
    return shape[index] if len(shape) >= abs(index) else 0


def _matmul(lhs: int) -> Callable[[_Op], int | None]:
    """Output elements x the contracted length, the last dim of operand ``lhs``."""
    def rule(op: _Op) -> int | None:
        out, operand = op.out_elements, op.shape(lhs)
        return out * _dim(operand, -1) if out is not None and operand is not None else None
    return rule


def _mmt4d(op: _Op) -> int | None:
    out, lhs = op.out_elements, op.shape(0)
    if out is None or lhs is None or len(lhs) < 4:
        return None
    return out * lhs[-3] * lhs[-1]  # [.., M1, K1, M0, K0]


def _attention(op: _Op) -> int | None:
    """Q [.., L, E] · Kᵀ [.., S, E] and P [.., L, S] · V [.., S, Ev]."""
    query, key, value = op.shape(0), op.shape(1), op.shape(2)
    if query is None or key is None or value is None:
        return None
    embed = query[-1]
    source = key[-2] if key[-1] == embed else key[-1]
    value_embed = value[-1] if value[-2] == source else value[-2]
    return math.prod(query[:-1]) * source * (embed + value_embed)


def _einsum(op: _Op) -> int | None:
    """Two operands: the product of every index size (each point of the joint index space
    is one multiply-accumulate); one operand is not a contraction."""
    equation, types = op.constant(0), op.constant(1)
    if not isinstance(equation, str) or not isinstance(types, tuple) or len(types) != 2 or "..." in equation:
        return None
    inputs = equation.replace(" ", "").split("->")[0].split(",")
    sizes: dict[str, int] = {}
    for letters, text in zip(inputs, types, strict=False):
        shaped = parse_shaped(text)
        dims = shaped.static_shape if shaped is not None else None
        if dims is None or len(dims) != len(letters):
            return None
        sizes.update(zip(letters, dims, strict=True))
    return math.prod(sizes.values())


def _torch_conv(transposed_at: int | None, always_transposed: bool = False) -> Callable[[_Op], int | None]:
    """Weight [O, I/g, k..] (transposed: [I, O/g, k..]): output (transposed: input)
    elements x the weight's volume past its first dim."""
    def rule(op: _Op) -> int | None:
        transposed = always_transposed or (transposed_at is not None and op.constant(transposed_at) is True)
        inputs, weight, out = op.elements(0), op.shape(1), op.out_elements
        if inputs is None or weight is None or out is None:
            return None
        return (inputs if transposed else out) * math.prod(weight[1:])
    return rule


def _onnx_gemm(op: _Op) -> int | None:
    out, lhs = op.out_elements, op.shape(0)
    if out is None or lhs is None:
        return None
    transposed = op.attributes.get("torch.onnx.transA", "").split(":")[0].strip() == "1"
    return out * lhs[0 if transposed else -1]


def _linalg_conv(op: _Op) -> int | None:
    out, rhs, key = op.out_elements, op.shape(1), op.key
    if out is None or rhs is None:
        return None
    layout = key.rsplit("_", 1)[-1]  # hwcf, fchw, hwc, hwcm, ...
    if "depthwise" in key:
        spatial = rhs[1:] if layout.startswith("c") else rhs[: len(rhs) - (2 if layout.endswith("m") else 1)]
        return out * math.prod(spatial)
    if layout.endswith("f"):  # ...hwcf: filter [kh, kw, c, f]
        return out * math.prod(rhs[:-1])
    if layout.startswith("f"):  # fchw: filter [f, c, kh, kw]
        return out * math.prod(rhs[1:])
    return out * math.prod(rhs)  # conv_1d / conv_2d / conv_3d: filter is the window


_KERNEL_SPEC = re.compile(r"\]x\[(?P<kernel>[^\]]*)\]->")


def _stablehlo_conv(op: _Op) -> int | None:
    """Output elements x kernel volume / output features (``o`` in ``dim_numbers``'s
    kernel spec; HWIO where the attribute is not at hand)."""
    out, kernel = op.out_elements, op.shape(1)
    if out is None or kernel is None:
        return None
    spec = _KERNEL_SPEC.search(op.attributes.get("dimension_numbers", op.attributes.get("dim_numbers", "")))
    letters = [part.strip() for part in spec["kernel"].split(",")] if spec else []
    features = kernel[letters.index("o")] if "o" in letters else kernel[-1]
    return out * math.prod(kernel) // max(1, features)


def _tosa_transpose_conv(op: _Op) -> int | None:
    """Weight [O, KH, KW, I]: input elements x O x KH x KW."""
    inputs, weight = op.elements(0), op.shape(1)
    return inputs * math.prod(weight[:-1]) if inputs is not None and weight is not None else None


def _tosa_conv(op: _Op) -> int | None:
    out, weight = op.out_elements, op.shape(1)
    return out * math.prod(weight[1:]) if out is not None and weight is not None else None


def _tosa_depthwise(op: _Op) -> int | None:
    out, weight = op.out_elements, op.shape(1)
    return out * weight[0] * weight[1] if out is not None and weight is not None else None


_MATRIX_PRODUCTS = ("linalg.matmul linalg.batch_matmul linalg.matmul_transpose_b linalg.batch_matmul_transpose_b "
                    "linalg.matvec linalg.vecmat linalg.batch_matvec linalg.batch_vecmat linalg.dot "
                    "linalg.batch_reduce_matmul aten.mm aten.bmm aten.matmul aten.dot aten.mv aten.vdot "
                    "stablehlo.dot tosa.matmul tosa.fully_connected onnx.matmul").split()
#: Contractions by rule key: op → its MACs (None: the types do not say).
MAC_RULES: dict[str, Callable[[_Op], int | None]] = {
    **{name: _matmul(0) for name in _MATRIX_PRODUCTS},
    "aten.addmm": _matmul(1), "aten.baddbmm": _matmul(1), "aten.addmv": _matmul(1), "aten.linear": _matmul(0),
    "aten.einsum": _einsum,
    "aten.scaled_dot_product_attention": _attention, "aten._scaled_dot_product_flash_attention": _attention,
    "aten._scaled_dot_product_efficient_attention": _attention, "iree_linalg_ext.attention": _attention,
    "iree_linalg_ext.online_attention": _attention,
    "linalg.mmt4d": _mmt4d, "linalg.batch_mmt4d": _mmt4d,
    "aten.convolution": _torch_conv(6), "aten._convolution": _torch_conv(6), "aten.convolution_overrideable": _torch_conv(6),
    "aten.conv1d": _torch_conv(None), "aten.conv2d": _torch_conv(None), "aten.conv3d": _torch_conv(None),
    "aten.conv_transpose1d": _torch_conv(None, True), "aten.conv_transpose2d": _torch_conv(None, True),
    "aten.conv_transpose3d": _torch_conv(None, True),
    "onnx.conv": _torch_conv(None), "onnx.convtranspose": _torch_conv(None, True), "onnx.gemm": _onnx_gemm,
    "stablehlo.convolution": _stablehlo_conv,
    "tosa.conv2d": _tosa_conv, "tosa.conv3d": _tosa_conv, "tosa.depthwise_conv2d": _tosa_depthwise,
    "tosa.transpose_conv2d": _tosa_transpose_conv,
}


def _mac_rule(key: str) -> Callable[[_Op], int | None] | None:
    if key in MAC_RULES:
        return MAC_RULES[key]
    if key.startswith(("linalg.conv_", "linalg.depthwise_conv")):
        return _linalg_conv
    return None


# --- arithmetic: FLOPs ------------------------------------------------------------------


_ELEMENTWISE_SUFFIXES = frozenset(
    "add sub mul div addf subf mulf divf addi subi muli maximumf minimumf maxsi minsi "
    "maximum minimum negate negf exp log tanh sigmoid logistic rsqrt sqrt abs absf pow "
    "relu clamp select erf reciprocal floor ceil cmpf cmpi and or xor max min rescale cast "
    "truncf extf sitofp fptosi mul_scalar add_scalar "
    # StableHLO spells the arithmetic out (stablehlo.multiply, not .mul).
    "subtract multiply divide exponential power remainder sine cosine gelu silu "
    "neg rsub square where hardtanh leaky_relu hardswish hardsigmoid softplus elu selu mish relu6 "
    "sign round log1p expm1 exponential_minus_one log_plus_one sin cos tan atan atan2 exp2 log2 cbrt "
    "logical_and logical_or logical_not logical_xor eq ne lt le gt ge compare not bitwise_and bitwise_or "
    "clamp_min clamp_max clip lerp addcmul addcdiv threshold log_sigmoid rem fmod convert tosa.table "
    "sigmoid hard_sigmoid hard_swish gelu_tanh fma __and__ __or__ __xor__ __invert__ bitwise_not diff cumsum cumprod "
    "logical_not".split()
)
_REDUCTIONS = frozenset("aten.sum aten.mean aten.amax aten.amin aten.max aten.min aten.var aten.std aten.var_mean "
                        "aten.std_mean aten.prod aten.norm aten.linalg_vector_norm aten.argmax aten.argmin "
                        "aten.logsumexp aten.all aten.any aten.adaptive_avg_pool1d aten.adaptive_avg_pool2d "
                        "aten._adaptive_avg_pool2d aten.adaptive_avg_pool3d aten.adaptive_max_pool2d "
                        "onnx.globalaveragepool onnx.globalmaxpool stablehlo.reduce".split())
#: FLOPs per element of the first operand, for ops a frontend keeps whole.
_PER_ELEMENT = {
    **dict.fromkeys("aten._softmax aten.softmax aten._log_softmax aten.log_softmax aten._safe_softmax "
                    "onnx.softmax onnx.logsoftmax linalg.softmax".split(), 5),
    **dict.fromkeys("aten.batch_norm aten._native_batch_norm_legit_no_training aten.native_batch_norm "
                    "aten._native_batch_norm_legit onnx.batchnormalization stablehlo.batch_norm_inference".split(), 4),
}
#: Norms: 5 FLOPs per element (mean, subtract, square, accumulate, normalize), +2 with an
#: affine weight and bias (operand positions), RMS norm 4 (+1 with a weight).
_NORMS = {"aten.layer_norm": (5, (2, 3)), "aten.native_layer_norm": (5, (2, 3)), "aten.group_norm": (5, (2, 3)),
          "aten.native_group_norm": (5, (1, 2)), "aten.instance_norm": (5, (1, 2)), "aten.rms_norm": (4, (2,)),
          "onnx.layernormalization": (5, (1, 2)), "onnx.instancenormalization": (5, (1, 2)),
          "onnx.groupnormalization": (5, (1, 2))}
_TORCH_POOLS = frozenset("aten.max_pool1d aten.max_pool2d aten.max_pool3d aten.max_pool2d_with_indices "
                         "aten.max_pool3d_with_indices aten.avg_pool1d aten.avg_pool2d aten.avg_pool3d".split())
_INTS = re.compile(r"-?\d+")


def _window(op: _Op) -> int | None:
    """Window volume of a pooling op: torch's kernel-size list operand, ONNX's
    ``kernel_shape``, TOSA's ``kernel``, StableHLO's ``window_dimensions``, linalg's
    window operand."""
    if op.key in _TORCH_POOLS:
        kernel = op.constant(1)
        return math.prod(kernel) if isinstance(kernel, tuple) and all(isinstance(k, int) for k in kernel) else None
    for attribute in ("torch.onnx.kernel_shape", "kernel", "window_dimensions"):
        if attribute in op.attributes:
            text = op.attributes[attribute].split(":", 1)[-1] if attribute == "kernel" else op.attributes[attribute]
            sizes = [int(v) for v in _INTS.findall(text.replace(" : si64", "").replace("i64", ""))]
            return math.prod(sizes) if sizes else None
    if op.key.startswith("linalg.pooling"):
        return op.elements(1)  # None when the window operand is not static
    return None


def _is_pool(key: str) -> bool:
    return key in _TORCH_POOLS or "pool" in key and key.startswith(("onnx.", "tosa.", "linalg.pooling")) \
        or key == "stablehlo.reduce_window"


def _elements(shaped: ShapedType | None) -> int | None:
    return shaped.elements if shaped is not None else None


def _arithmetic(op: _Op, iteration_space: int | None, body_ops: int) -> int | None:
    key = op.key
    first = op.ins[0] if op.ins else None
    if key in _PER_ELEMENT:
        return _PER_ELEMENT[key] * first.elements if first is not None and first.elements else None
    if key in _NORMS:
        per, affine = _NORMS[key]
        present = sum(1 for index in affine if index < len(op.ins) and op.ins[index] is not None)
        extra = 2 if per == 5 and present == len(affine) else present if per == 4 else 0
        return (per + extra) * first.elements if first is not None and first.elements else None
    if _is_pool(key) and key not in _REDUCTIONS:
        window, out = _window(op), op.out_elements
        return out * window if window and out is not None else None
    if key in _REDUCTIONS or _is_reduction(key):
        return _elements(first)
    if iteration_space is not None and body_ops:
        return iteration_space * body_ops
    if _elementwise_kind(key) in _ELEMENTWISE_SUFFIXES and op.out is not None:
        return op.out.elements
    return None


#: Elementwise functions XLA's HloCostAnalysis counts as transcendentals, by the last
#: segment of the op name (torch ``aten.exp``, StableHLO ``exponential``, ``math.exp``).
TRANSCENDENTAL_FUNCTIONS = frozenset(
    "exp exponential expm1 exponential_minus_one log log1p log_plus_one tanh logistic sigmoid sqrt rsqrt cbrt "
    "pow power powf sin sine cos cosine tan atan2 erf exp2 log2".split())
#: Activations that are arithmetic around transcendentals: transcendentals per element
#: (their 1 FLOP per element stays).
COMPOSITE_TRANSCENDENTALS = {"gelu": 1, "gelu_tanh": 1, "silu": 1, "softplus": 2, "mish": 3, "elu": 1, "selu": 1,
                             "celu": 1, "log_sigmoid": 2}
_SOFTMAX = frozenset("aten._softmax aten.softmax aten._log_softmax aten.log_softmax aten._safe_softmax "
                     "onnx.softmax onnx.logsoftmax linalg.softmax".split())


def is_transcendental(name: str) -> bool:
    """Whether a ``math`` op of a structured op's body (or any op by its name) is one."""
    return _elementwise_kind(rule_key(name)) in TRANSCENDENTAL_FUNCTIONS


def _transcendentals(op: _Op, flops: int, iteration_space: int | None, body_ops: int,
                     body_transcendentals: int) -> tuple[int, int]:
    """(FLOPs, transcendentals) of an arithmetic op whose rules gave ``flops`` in all."""
    key, out = op.key, op.out
    if key in _SOFTMAX:
        first = op.ins[0] if op.ins else None
        elements = first.elements if first is not None and first.elements else 0
        return flops - elements, elements  # its exp; 4 FLOPs per element remain
    if iteration_space is not None and body_ops and flops == iteration_space * body_ops:
        counted = min(body_transcendentals, body_ops)
        return iteration_space * (body_ops - counted), iteration_space * counted
    kind = _elementwise_kind(key)
    if out is not None and out.elements is not None and flops == out.elements:
        if kind in TRANSCENDENTAL_FUNCTIONS:
            return 0, out.elements
        if kind in COMPOSITE_TRANSCENDENTALS:
            return flops, COMPOSITE_TRANSCENDENTALS[kind] * out.elements
    return flops, 0


def _is_reduction(key: str) -> bool:
    return (key.endswith(("reduce", "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "argmax"))
            or ".reduce" in key)


def _elementwise_kind(key: str) -> str:
    """The kind an op name says, for the elementwise rule: its last segment."""
    return key if key == "tosa.table" else key.rsplit(".", 1)[-1]


# --- data movement --------------------------------------------------------------------------

_DATA_SUFFIXES = frozenset(
    "view reshape _unsafe_view transpose permute t cat concat concatenate slice slice_tensor slice_scatter "
    "expand expand_as broadcast broadcast_to broadcast_in_dim clone copy copy_ contiguous squeeze unsqueeze "
    "flatten unflatten embedding gather index_select index select split split_with_sizes chunk stack tile "
    "repeat pad constant_pad_nd reflection_pad2d replicate_pad2d extract_slice insert_slice dynamic_slice "
    "dynamic_update_slice pack unpack set_encoding unset_encoding fill iota _to_copy to detach alias "
    "lift_fresh_copy scatter reverse flip roll narrow as_strided collapse_shape expand_shape arange full zeros ones "
    "empty empty_like zeros_like ones_like full_like new_zeros new_ones new_empty new_full scalar_tensor "
    "unbind _assert_tensor_metadata".split())


def _moves_data(key: str) -> bool:
    if key.startswith("stablehlo.select") or key == "tosa.select":
        return False
    return key.rsplit(".", 1)[-1] in _DATA_SUFFIXES or key.startswith(("iree_encoding.", "tensor."))


def op_cost(name: str, operands: Sequence[str], results: Sequence[str], body_ops: int = 0,
            iteration_space: int | None = None, reduction: bool = False,
            contraction: int | None = None, *, multiply_accumulate: bool | None = None,
            constants: Sequence[Any] = (), attributes: Mapping[str, str] | None = None,
            body_transcendentals: int = 0) -> Cost:
    """Cost of one op (the rules: this module's docstring).

    ``body_ops`` and ``iteration_space`` describe a structured op (arith/math ops in its
    body, product of its loop bounds) when the engine can tell; ``multiply_accumulate``:
    whether that body multiplies and accumulates (``None``: assume so for a reduction with
    two or more body ops); ``contraction``: the contracted length of a ``dot_general``.
    ``constants``: per operand, the value of a torch constant operand (int, float, bool,
    str, a tuple for a list; a list of tensors as a tuple of their type texts), else
    None; ``attributes``: the op's attributes as text; ``body_transcendentals``: how
    many of the ``body_ops`` are transcendental (:func:`is_transcendental`)."""
    ins = [parse_shaped(text) for text in operands]
    outs = [parse_shaped(text) for text in results]
    tensor_bytes = [type_bytes(text) for text in (*operands, *results) if parse_shaped(text) is not None]
    known_bytes = [size for size in tensor_bytes if size is not None]
    nbytes = sum(known_bytes) if tensor_bytes and len(known_bytes) == len(tensor_bytes) else None
    op = _Op(rule_key(name), ins, outs, constants, attributes or {})
    rule = _mac_rule(op.key)
    macs = rule(op) if rule is not None and op.out is not None else None
    out_elements = op.out_elements
    if macs is None and contraction is not None and out_elements is not None:
        macs = out_elements * contraction
    accumulates = multiply_accumulate if multiply_accumulate is not None else body_ops >= 2
    if macs is None and rule is None and iteration_space is not None and reduction and accumulates:
        macs = iteration_space  # one multiply-accumulate per point of the loop nest
    if macs is not None:
        return Cost(macs, 2 * macs, nbytes, CONTRACTION)
    if rule is not None:
        return Cost(None, None, nbytes, UNKNOWN)  # a contraction whose shapes are not static
    flops = _arithmetic(op, iteration_space, body_ops)
    if flops is not None:
        flops, transcendentals = _transcendentals(op, flops, iteration_space, body_ops, body_transcendentals)
        return Cost(None, flops, nbytes, ARITHMETIC, transcendentals)
    return Cost(None, None, nbytes, DATA if _moves_data(op.key) else UNKNOWN)
