"""What each dispatch region computes and moves, counted from the ops it holds after
``dispatch-creation``: the lowered ``linalg`` / ``iree_linalg_ext`` ops of its body.

Per op of the region, :func:`dfit_mlir.core.costs.op_cost` gives its MACs, FLOPs and
transcendentals (contractions by their rule, anything else by iteration domain x
arithmetic ops of its body, its transcendental ``math`` ops counted apart), credited to the source op its location names first (its root ID). Fills,
copies, pads, slices, packs and encodings are data movement: no MACs, no FLOPs. The
region's bytes are what crosses its boundary: the tensors it reads
(``flow.dispatch.workgroups`` operands) and writes (its results), not the sum of its
ops' operands. Its element type (``dtype``) is the first operand's of the lowered op
doing most MACs (else most FLOPs): what runs, after the compiler folded a quantized
graph's ``DequantizeLinear → Conv → QuantizeLinear`` into an ``i8 x i8 → i32`` conv,
where the source ops still carry the float types of the QDQ graph.

These per-op figures are *weights*: :mod:`dfit_mlir.core.site_costs` places a source op's
cost over the dispatches that name it in proportion to them, so a conv's MACs land in
the dispatch that convolves, never in the one its bias add was fused into, and an
encoding dispatch carries bytes and no MACs.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from iree.compiler import ir

from dfit_mlir.core import costs

#: Ops of a region body that compute or move tensors (counted); others (scalar arith on
#: indices, tensor loads/stores of the dispatch ABI) are not.
_COUNTED_PREFIXES = ("linalg.", "iree_linalg_ext.", "tensor.pad", "tensor.concat", "iree_encoding.", "linalg_ext.")


@dataclass(frozen=True, slots=True)
class RegionCost:
    """Per source ID, the MACs / FLOPs the region's ops credited to it compute; the bytes
    read and written at the region's boundary (None: a dynamic or unknown size)."""

    op_macs: dict[str, int] = field(default_factory=dict)
    op_flops: dict[str, int] = field(default_factory=dict)
    bytes_read: int | None = None
    bytes_written: int | None = None
    op_transcendentals: dict[str, int] = field(default_factory=dict)
    #: Element type of the first operand of the region's op doing most MACs, else most
    #: FLOPs, else of the region's first shaped operand (None: none is shaped).
    dtype: str | None = None

    @property
    def macs(self) -> int:
        return sum(self.op_macs.values())

    @property
    def flops(self) -> int:
        return sum(self.op_flops.values())

    @property
    def transcendentals(self) -> int:
        return sum(self.op_transcendentals.values())


def region_cost(region: ir.Operation, ids_of: object, tree: Any = None) -> RegionCost:
    """Cost of one ``flow.dispatch.workgroups`` / ``flow.dispatch.region``; ``ids_of``:
    location → source IDs (a snapshot ``LocationCache.ids``); ``tree``: the snapshot's
    ``OpTree`` (its plain ops spare the import of each dialect's Python module)."""
    children = tree.children if tree is not None else _children
    op_macs: dict[str, int] = {}
    op_flops: dict[str, int] = {}
    op_transcendentals: dict[str, int] = {}
    heaviest: tuple[int, int, str] | None = None  # (MACs, FLOPs, first operand's element type)
    pending = deque(children(region))
    while pending:
        op = pending.popleft()
        if not op.name.startswith(_COUNTED_PREFIXES):
            pending.extend(children(op))
            continue
        source = ids_of(op.location)  # type: ignore[operator]
        if not source:
            continue
        cost = _op_cost(op, children)
        first = _element_type(op.operands[0].type) if len(op.operands) else None
        if first is not None and (cost.macs or cost.flops) and (
                heaviest is None or (cost.macs or 0, cost.flops or 0) > heaviest[:2]):
            heaviest = (cost.macs or 0, cost.flops or 0, first)
        if cost.macs:
            op_macs[source[0]] = op_macs.get(source[0], 0) + cost.macs
        if cost.flops:
            op_flops[source[0]] = op_flops.get(source[0], 0) + cost.flops
        if cost.transcendentals:
            op_transcendentals[source[0]] = op_transcendentals.get(source[0], 0) + cost.transcendentals
    read = [costs.type_bytes(str(v.type)) for v in region.operands if costs.parse_shaped(str(v.type))]
    written = [costs.type_bytes(str(v.type)) for v in region.results if costs.parse_shaped(str(v.type))]
    dtype = heaviest[2] if heaviest is not None else next(
        (found for v in region.operands if (found := _element_type(v.type)) is not None), None)
    return RegionCost(op_macs, op_flops, _total(read), _total(written), op_transcendentals, dtype)


def _element_type(value_type: Any) -> str | None:
    shaped = costs.parse_shaped(str(value_type))
    return shaped.dtype if shaped is not None else None


def _total(sizes: list[int | None]) -> int | None:
    return None if None in sizes else sum(sizes)  # type: ignore[arg-type]


_ATTENTION_OPS = frozenset({"iree_linalg_ext.attention", "iree_linalg_ext.online_attention"})


def _op_cost(op: ir.Operation, children: Callable[[ir.Operation], list[ir.Operation]]) -> costs.Cost:
    if op.name in _ATTENTION_OPS:
        macs = attention_macs(op)
        if macs is not None:
            return costs.Cost(macs, 2 * macs, None, costs.CONTRACTION)
    space, reduction, body_ops, accumulates = structured_loops(op, children)
    return costs.op_cost(op.name, [str(v.type) for v in op.operands], [str(v.type) for v in op.results],
                         body_ops=body_ops, iteration_space=space, reduction=reduction,
                         multiply_accumulate=accumulates if space is not None else None,
                         body_transcendentals=body_transcendentals(op, children))


def _children(op: ir.Operation) -> list[ir.Operation]:
    return [child.operation for region in op.regions for block in region.blocks for child in block.operations]


_ARITH_DIALECTS = ("arith.", "math.")


def structured_loops(op: ir.Operation, children: Callable[[ir.Operation], list[ir.Operation]] | None = None,
                     ) -> tuple[int | None, bool, int, bool]:
    """(iteration space size, has a reduction loop, arith ops in the body, whether the
    body multiplies and adds) of a structured op with ``indexing_maps``; (None, False, 0,
    False) when not derivable."""
    attributes = op.attributes
    if "indexing_maps" not in attributes or not op.regions:
        return None, False, 0, False
    if children is None:
        inner = [child.operation for block in op.regions[0].blocks for child in block.operations]
    else:
        inner = children(op)  # all regions; a structured op has one
    body = [child.name for child in inner if child.name.startswith(_ARITH_DIALECTS)]
    accumulates = any(n in _MULTIPLIES for n in body) and any(n in _ADDS for n in body)
    reduction = "reduction" in str(attributes["iterator_types"]) if "iterator_types" in attributes else False
    bounds: dict[int, int] = {}
    operands = list(op.operands)
    for index, map_attr in enumerate(ir.ArrayAttr(attributes["indexing_maps"])):
        if index >= len(operands):
            break
        shaped = costs.parse_shaped(str(operands[index].type))
        if shaped is None:
            continue
        for dim, expr in zip(shaped.shape, ir.AffineMapAttr(map_attr).value.results, strict=False):
            if dim is not None and isinstance(expr, ir.AffineDimExpr):
                bounds.setdefault(expr.position, dim)
    n_loops = ir.AffineMapAttr(ir.ArrayAttr(attributes["indexing_maps"])[0]).value.n_dims
    if len(bounds) < n_loops:
        return None, reduction, len(body), accumulates
    return math.prod(bounds.values()), reduction, len(body), accumulates


def body_transcendentals(op: ir.Operation,
                         children: Callable[[ir.Operation], list[ir.Operation]] | None = None) -> int:
    """How many ``math`` ops of a structured op's body are transcendental
    (:func:`dfit_mlir.core.costs.is_transcendental`: ``math.exp``, ``math.tanh``, ...)."""
    if "indexing_maps" not in op.attributes or not op.regions:
        return 0
    inner = children(op) if children is not None else \
        [child.operation for block in op.regions[0].blocks for child in block.operations]
    return sum(1 for child in inner if child.name.startswith("math.") and costs.is_transcendental(child.name))


_MULTIPLIES = frozenset({"arith.mulf", "arith.muli"})
_ADDS = frozenset({"arith.addf", "arith.addi"})


def loop_bounds(op: ir.Operation) -> tuple[dict[int, int], list[list[int]]] | None:
    """(loop dim → static size, per operand the dims its indexing map reads) of an op
    with ``indexing_maps``; None without them."""
    if "indexing_maps" not in op.attributes:
        return None
    bounds: dict[int, int] = {}
    dims: list[list[int]] = []
    for value, map_attr in zip(op.operands, ir.ArrayAttr(op.attributes["indexing_maps"]), strict=False):
        results = ir.AffineMapAttr(map_attr).value.results
        dims.append([expr.position for expr in results if isinstance(expr, ir.AffineDimExpr)])
        shaped = costs.parse_shaped(str(value.type))
        for dim, expr in zip(shaped.shape if shaped else (), results, strict=False):
            if dim is not None and isinstance(expr, ir.AffineDimExpr):
                bounds.setdefault(expr.position, dim)
    return bounds, dims


def attention_macs(op: ir.Operation) -> int | None:
    """``Q·Kᵀ`` over the loops query and key index, plus ``P·V`` over those the value and
    the output index (the maps say which loop is batch, L, S, E, Ev in any layout)."""
    found = loop_bounds(op)
    if found is None or len(found[1]) < 3:
        return None
    bounds, dims = found
    query, key, value, out = dims[0], dims[1], dims[2], dims[-1]
    first, second = set(query) | set(key), set(out) | set(value)
    if not first.issubset(bounds) or not second.issubset(bounds):
        return None
    return math.prod(bounds[d] for d in first) + math.prod(bounds[d] for d in second)
