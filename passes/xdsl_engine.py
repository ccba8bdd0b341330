"""The ID algorithm and the dfit encoding on xDSL operations.

For the same input, :class:`XdslEngine` must give exactly the IDs and hashes of
:class:`dfit_mlir.passes.mlir_engine.MlirEngine`. The hash reads printed attribute text,
so attributes are printed with :class:`_MlirTextPrinter`: xDSL's printer with the few
spellings where xDSL and MLIR's ``AsmPrinter`` disagree brought to MLIR's form; named
linalg ops' hidden regions are hashed as MLIR builds them (:func:`_combiner_operands`).

Known gaps (the hashes then differ from MLIR's): affine expressions that MLIR and xDSL
*build* differently (xDSL distributes ``(d0 + d1) * 2``, MLIR keeps it; MLIR moves
constants last in ``d0 + 1 + d1``); affine sets; properties (``<{...}>``) of ops
unregistered in MLIR, which MLIR does not show.
"""

from __future__ import annotations

import math
import struct
from io import StringIO
from typing import Hashable, Iterable, Iterator, Sequence

from xdsl.context import Context
from xdsl.dialects.builtin import (
    AffineMapAttr,
    AnyFloat,
    ArrayAttr,
    BFloat16Type,
    CallSiteLoc,
    DenseIntOrFPElementsAttr,
    DenseResourceAttr,
    DictionaryAttr,
    FileLineColLoc,
    Float16Type,
    Float32Type,
    Float64Type,
    FloatAttr,
    FusedLoc,
    IntegerAttr,
    ModuleOp,
    NameLoc,
    NoneAttr,
    ShapedType,
    StringAttr,
    UnknownLoc,
    UnregisteredOp,
    i64,
)
from xdsl.dialects.linalg.abstract_ops import NamedOperation, PoolingOperation
from xdsl.dialects.linalg.ops import YieldOp
from xdsl.ir import Attribute, Operation
from xdsl.ir.affine import (
    AffineBinaryOpExpr,
    AffineBinaryOpKind,
    AffineConstantExpr,
    AffineExpr,
    AffineMap,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.universe import Universe
from xdsl.utils.hints import isa

from dfit_mlir.core import ids, locations
from dfit_mlir.core.locations import DFIT_NAME_PREFIX, Loc

#: Attributes xDSL keeps on an op that are not part of it in MLIR: an unregistered op's
#: name (xDSL stores it as an attribute, MLIR as the op name).
_XDSL_ONLY_ATTRS = frozenset({"op_name__"})


def context() -> Context:
    """A context with every dialect ``xdsl-opt`` knows (dfit's included, loaded lazily)
    that also accepts unregistered ops, as the MLIR engine's context does."""
    ctx = Context(allow_unregistered=True)
    for name, factory in Universe.get_multiverse().all_dialects.items():
        ctx.register_dialect(name, factory)
    return ctx


def parse(text: str, name: str = "<text>") -> ModuleOp:
    """Parse MLIR text into an xDSL module with :func:`context`."""
    return Parser(context(), text, name).parse_module()


def walk_ops(root: Operation) -> Iterator[Operation]:
    """Pre-order walk of every op nested under ``root`` (``root`` excluded). Iterative:
    xDSL's own ``Operation.walk`` recurses, and nesting depth is the input's."""
    stack = [iter(child for region in root.regions for block in region.blocks for child in block.ops)]
    while stack:
        op = next(stack[-1], None)
        if op is None:
            stack.pop()
            continue
        yield op
        stack.append(iter(child for region in op.regions for block in region.blocks for child in block.ops))


class XdslEngine:
    """:class:`dfit_mlir.core.ids.IREngine` over xDSL operations."""

    def op_name(self, op: Operation) -> str:
        name = op.op_name.data if isinstance(op, UnregisteredOp) else op.name
        if name in ids.GENERIC_OPS:
            name_attr = op.properties.get("name", op.attributes.get("name"))
            return ids.display_name(name, name_attr.data if isinstance(name_attr, StringAttr) else None)
        return name

    def symbol_name(self, op: Operation) -> str | None:
        # MLIR shows inherent attributes (xDSL properties) and discardable ones alike.
        name = op.properties.get("sym_name", op.attributes.get("sym_name"))
        return name.data if isinstance(name, StringAttr) else None

    def signature(self, op: Operation) -> str:
        # MLIR's ``op.attributes`` holds properties and attributes together.
        merged = {**op.attributes, **op.properties}
        pairs = [(name, _attr_text(value)) for name, value in merged.items()
                 if name not in _XDSL_ONLY_ATTRS]
        return ids.signature(pairs, (_text(result.type) for result in op.results))

    def operand_keys(self, op: Operation) -> Sequence[Hashable]:
        return _combiner_operands(op) or list(op.operands)

    def result_keys(self, op: Operation) -> Sequence[Hashable]:
        return list(op.results)

    def blocks(
        self, op: Operation
    ) -> Iterable[tuple[Sequence[tuple[Hashable, str]], Sequence[Operation]]]:
        for region in op.regions:
            for block in region.blocks:
                yield [(arg, _text(arg.type)) for arg in block.args], list(block.ops)


def _combiner_operands(op: Operation) -> list[Hashable] | None:
    """Operands of a named linalg op's combiner in the order MLIR builds them.

    A named op (``linalg.matmul``, ``linalg.conv_*``, ``linalg.pooling_*``) parsed from
    its custom form gets a hidden region from the dialect's builder, and xDSL's builders
    differ from MLIR's (opdsl), which always writes ``O = combine(O, value)``:
    xDSL builds ``add(mul, O)`` for matmul/conv and ``max(in, window)`` for pooling.
    The combiner (the op the region yields) is hashed as MLIR builds it. A region
    written out in generic form already has MLIR's order and is left alone.
    """
    parent = op.parent_op()
    block = op.parent_block()
    if not isinstance(parent, NamedOperation) or block is None or not block.args:
        return None
    if not isinstance(op.next_op, YieldOp) or tuple(op.next_op.operands) != tuple(op.results):
        return None
    accumulator = block.args[-1]
    operands = list(op.operands)
    if len(operands) != 2 or operands[0] is accumulator:
        return None
    if operands[1] is accumulator:  # add(mul, O) -> add(O, mul)
        return [accumulator, operands[0]]
    if isinstance(parent, PoolingOperation):  # max(in, window) -> max(O, in)
        return [accumulator, block.args[0]]
    return None


def _attr_text(attr: Attribute) -> str:
    """Printed value for the hash; large elements attributes (weights) by type only,
    exactly as ``mlir_engine._attr_text``."""
    if isinstance(attr, DenseIntOrFPElementsAttr | DenseResourceAttr):
        shaped = attr.get_type()
        if isinstance(shaped, ShapedType):
            shape = shaped.get_shape()
            if any(dim < 0 for dim in shape) or math.prod(shape) > ids.MAX_HASHED_ELEMENTS:
                return f"elements<{_text(shaped)}>"
    return _text(attr)


def _text(attr: Attribute) -> str:
    stream = StringIO()
    _MlirTextPrinter(stream=stream).print_attribute(attr)
    return stream.getvalue()


class _MlirTextPrinter(Printer):
    """xDSL's printer, spelling attributes as MLIR's ``AsmPrinter`` does.

    Normalizations (each one a place where xDSL 0.74 prints differently):

    * floats: MLIR's ``printFloatValue`` (round to 6 digits, keep if it parses back,
      else APFloat's shortest form ``-3.40282347E+38``; hex for inf/NaN in upper case);
      xDSL writes the fallback as ``-3.40282347e+38`` and hex in lower case;
    * affine maps: MLIR binds ``*`` tighter than ``+`` and writes ``d0 - d1`` and
      ``d0 - 1``; xDSL parenthesizes every binary expression (``(d1 + d4)``);
    * arrays: MLIR elides ``: i64`` and ``: f64`` on elements of an array
      (``[[0], [1, 2]]``, xDSL: ``[[0 : i64], ...]``);
    * dictionaries: MLIR keeps them sorted by name; xDSL keeps the written order.
    """

    def print_float(self, value: float, type: AnyFloat) -> None:
        text = _mlir_float(value, type)
        if text is None:  # f80, f128, f8*: left to xDSL
            super().print_float(value, type)
        else:
            self.print_string(text)

    def print_attribute(self, attribute: Attribute) -> None:
        if isinstance(attribute, AffineMapAttr):
            self.print_string(f"affine_map<{_affine_map(attribute.data)}>")
        elif isinstance(attribute, ArrayAttr):
            self.print_string("[")
            self.print_list(attribute.data, self._print_array_element)
            self.print_string("]")
        elif isinstance(attribute, DictionaryAttr):
            self.print_attr_dict(dict(sorted(attribute.data.items())))
        else:
            super().print_attribute(attribute)

    def _print_array_element(self, attribute: Attribute) -> None:
        # MLIR prints array elements with ``AttrTypeElision::May``.
        if isinstance(attribute, IntegerAttr) and attribute.type == i64:
            self.print_int(attribute.value.data)
        elif isinstance(attribute, FloatAttr) and isinstance(attribute.type, Float64Type):
            self.print_float(attribute.value.data, attribute.type)
        else:
            self.print_attribute(attribute)


# --- floats as MLIR prints them --------------------------------------------------------

#: float type -> (significand bits, struct format or None for bf16, bit width)
_FLOAT_FORMATS: dict[type, tuple[int, str | None, int]] = {
    Float16Type: (11, "e", 16),
    BFloat16Type: (8, None, 16),
    Float32Type: (24, "f", 32),
    Float64Type: (53, "d", 64),
}


def _round_to(value: float, fmt: str | None) -> float:
    if fmt is not None:
        try:
            return float(struct.unpack(fmt, struct.pack(fmt, value))[0])
        except OverflowError:  # beyond the largest finite value: APFloat rounds to inf
            return math.copysign(math.inf, value)
    # bfloat16: round-to-nearest-even on the top 16 bits of the f32 pattern.
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


def _bits(value: float, fmt: str | None, width: int) -> int:
    if fmt is None:
        return int(struct.unpack("<I", struct.pack("<f", value))[0]) >> 16
    return int.from_bytes(struct.pack("<" + fmt, value), "little") & ((1 << width) - 1)


def _mlir_float(value: float, type: Attribute) -> str | None:
    """MLIR's ``printFloatValue``; None for types it does not cover."""
    spec = _FLOAT_FORMATS.get(type.__class__)
    if spec is None:
        return None
    precision_bits, fmt, width = spec
    value = _round_to(value, fmt)
    if math.isfinite(value):
        text = _apfloat_to_string(value, precision_bits, 6, 0, truncate_zero=False)
        if _bits(_round_to(float(text), fmt), fmt, width) == _bits(value, fmt, width):
            return text
        text = _apfloat_to_string(value, precision_bits, 0, 3, truncate_zero=True)
        if "." in text:
            return text
    return f"0x{_bits(value, fmt, width):X}"


def _apfloat_to_string(
    value: float, precision_bits: int, format_precision: int, max_padding: int, *,
    truncate_zero: bool,
) -> str:
    """LLVM's ``APFloat::toString`` for a finite value, step by step: the exact value
    N * 10^exp, a first cut of decimal digits by integer division (``AdjustToPrecision``
    on the APInt), then round half up to ``format_precision`` digits."""
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        if max_padding:
            return sign + "0"
        if truncate_zero:
            return sign + "0.0E+0"
        return sign + "0." + "0" * max(format_precision, 1) + "e+00"
    if not format_precision:
        format_precision = 2 + precision_bits * 59 // 196
    numerator, denominator = abs(value).as_integer_ratio()  # denominator: a power of two
    binary_exp = 1 - denominator.bit_length()
    significand, exp = (numerator * 5**-binary_exp, binary_exp) if binary_exp else (numerator, 0)
    bits_required = (format_precision * 196 + 58) // 59
    if significand.bit_length() > bits_required:
        removable = (significand.bit_length() - bits_required) * 59 // 196
        significand //= 10**removable
        exp += removable
    digits = [int(d) for d in str(significand)]  # most significant first
    while digits[-1] == 0:
        digits.pop()
        exp += 1
    if len(digits) > format_precision:
        dropped = len(digits) - format_precision
        round_up = digits[format_precision] >= 5
        digits = digits[:format_precision]
        exp += dropped
        if round_up:
            position = len(digits) - 1
            while position >= 0 and digits[position] == 9:
                position -= 1
            if position < 0:
                exp += len(digits)
                digits = [1]
            else:
                exp += len(digits) - 1 - position
                digits = digits[:position] + [digits[position] + 1]
        while digits[-1] == 0:
            digits.pop()
            exp += 1
    text = "".join(map(str, digits))
    count = len(digits)

    if not max_padding:
        scientific = True
    elif exp >= 0:
        scientific = exp > max_padding or count + exp > format_precision
    else:
        msd = exp + count - 1
        scientific = msd < 0 and -msd > max_padding
    if scientific:
        exp += count - 1
        mantissa = text[0] + "." + (text[1:] or ("0" if truncate_zero else ""))
        if not truncate_zero:
            mantissa += "0" * max(format_precision - (count - 1), 0)
        exponent = ("-" if exp < 0 else "+") + str(abs(exp)).rjust(1 if truncate_zero else 2, "0")
        return f"{sign}{mantissa}{'E' if truncate_zero else 'e'}{exponent}"
    if exp >= 0:
        return sign + text + "0" * exp
    whole = exp + count
    if whole > 0:
        return f"{sign}{text[:whole]}.{text[whole:]}"
    return f"{sign}0.{'0' * -whole}{text}"


# --- affine maps as MLIR prints them --------------------------------------------------

_AFFINE_SPELLING = {
    AffineBinaryOpKind.Add: " + ",
    AffineBinaryOpKind.Mul: " * ",
    AffineBinaryOpKind.FloorDiv: " floordiv ",
    AffineBinaryOpKind.CeilDiv: " ceildiv ",
    AffineBinaryOpKind.Mod: " mod ",
}


def _affine_map(amap: AffineMap) -> str:
    dims = ", ".join(f"d{i}" for i in range(amap.num_dims))
    symbols = ", ".join(f"s{i}" for i in range(amap.num_symbols))
    results = ", ".join(_affine_expr(expr, strong=False) for expr in amap.results)
    return f"({dims})" + (f"[{symbols}]" if amap.num_symbols else "") + f" -> ({results})"


def _affine_expr(expr: AffineExpr, strong: bool) -> str:
    """MLIR's ``printAffineExprInternal``: ``strong`` is ``BindingStrength::Strong``."""
    if not isinstance(expr, AffineBinaryOpExpr):
        return str(expr)  # d0, s0, 42: spelled alike
    lhs, rhs, kind = expr.lhs, expr.rhs, expr.kind
    if kind != AffineBinaryOpKind.Add:
        if kind == AffineBinaryOpKind.Mul and _const(rhs) == -1:
            body = "-" + _affine_expr(lhs, True)
        else:
            body = _affine_expr(lhs, True) + _AFFINE_SPELLING[kind] + _affine_expr(rhs, True)
        return f"({body})" if strong else body
    if isinstance(rhs, AffineBinaryOpExpr) and rhs.kind == AffineBinaryOpKind.Mul:
        factor = _const(rhs.rhs)
        if factor == -1:
            inner = rhs.lhs  # d0 - (d1 + d2): a sum keeps its parentheses
            inner_is_sum = _is_sum(inner)
            body = _affine_expr(lhs, False) + " - " + _affine_expr(inner, inner_is_sum)
            return f"({body})" if strong else body
        if factor is not None and factor < -1:
            body = f"{_affine_expr(lhs, False)} - {_affine_expr(rhs.lhs, True)} * {-factor}"
            return f"({body})" if strong else body
    constant = _const(rhs)
    if constant is not None and constant < 0:
        body = f"{_affine_expr(lhs, False)} - {-constant}"
    else:
        body = _affine_expr(lhs, False) + " + " + _affine_expr(rhs, False)
    return f"({body})" if strong else body


def _is_sum(expr: AffineExpr) -> bool:
    return isinstance(expr, AffineBinaryOpExpr) and expr.kind == AffineBinaryOpKind.Add


def _const(expr: AffineExpr) -> int | None:
    return expr.value if isinstance(expr, AffineConstantExpr) else None


# --- the dfit encoding -----------------------------------------------------------------


def to_loc(location: Attribute) -> Loc:
    """Convert an xDSL location attribute into the engine-neutral tree of
    :mod:`dfit_mlir.core.locations`."""
    if isinstance(location, NameLoc):
        child = location.location
        # xDSL parses ``loc("name")`` with a NoneAttr child, MLIR with an unknown one.
        child_loc = None if isinstance(child, NoneAttr | UnknownLoc) else to_loc(child)
        return locations.NameLoc(location.desc.data, child_loc)
    if isinstance(location, FileLineColLoc):
        return locations.FileLoc(location.filename.data, location.line.data, location.column.data)
    if isinstance(location, CallSiteLoc):
        return locations.CallSiteLoc(to_loc(location.callee), to_loc(location.caller))
    if isinstance(location, FusedLoc) and isa(location.locations, ArrayAttr[Attribute]):
        return locations.FusedLoc(tuple(to_loc(item) for item in location.locations.data))
    return locations.UNKNOWN


def original_location(location: Attribute) -> Attribute:
    """The location below any dfit NameLoc wrappers (so re-tagging never nests them);
    NoneAttr where there is none."""
    while isinstance(location, NameLoc) and location.desc.data.startswith(DFIT_NAME_PREFIX):
        location = location.location
    return location


def tag_module(module: Operation) -> list[ids.TaggedOp[Operation]]:
    """Stamp ``dfit.id`` / ``dfit.hash`` attributes and a ``dfit:<id>`` NameLoc wrapping
    the original location on every op below ``module``; returns what was stamped."""
    tagged = ids.assign_ids(XdslEngine(), module)
    for item in tagged:
        op = item.op
        op.attributes[ids.ID_ATTR] = StringAttr(item.id)
        op.attributes[ids.HASH_ATTR] = StringAttr(item.hash)
        child = original_location(op.location)
        if isinstance(child, UnknownLoc):  # printed ``loc("dfit:<id>")``, as MLIR does
            child = NoneAttr()
        op.location = NameLoc(StringAttr(DFIT_NAME_PREFIX + item.id), child)
    return tagged
