"""The manifest's operator and tensor tables, read off a freshly tagged module."""

from __future__ import annotations

import functools
import math
import re
from typing import Any

from iree.compiler import ir

from dfit_mlir import frontends
from dfit_mlir.core import costs, ids, locations
from dfit_mlir.core.ids import TaggedOp
from dfit_mlir.core.perf import paused_gc
from dfit_mlir.passes import loop_trips, mlir_engine, region_costs
from dfit_mlir.passes.loop_trips import LoopTrips
from dfit_mlir.passes.snapshot import LocationCache


def _value_info(value: ir.Value) -> dict[str, Any]:
    info = dict(_type_info(str(value.type)))
    if "shape" in info:
        info["shape"] = list(info["shape"])
    return info


@functools.lru_cache(maxsize=8192)
def _type_info(text: str) -> tuple[tuple[str, Any], ...]:
    shaped = costs.parse_shaped(text)
    if shaped is None:
        return (("type", text),)
    return (("type", text), ("shape", shaped.shape), ("dtype", shaped.dtype), ("bytes", shaped.nbytes))


#: Ops whose attributes a cost rule reads (dimension numbers, windows, ONNX attributes).
_ATTRIBUTE_PREFIXES = ("stablehlo.convolution", "stablehlo.reduce_window", "tosa.", "torch.operator")


def _constants(op: ir.Operation) -> tuple[Any, ...]:
    """Per operand: the value of a torch constant (or list of constants; a list of
    tensors as their type texts) it is, else None: the scalar arguments cost rules read."""
    if not op.name.startswith("torch."):
        return ()
    return tuple(_constant_value(value) for value in op.operands)


def _constant_value(value: ir.Value, depth: int = 0) -> Any:
    owner = value.owner
    owner = owner.operation if isinstance(owner, ir.OpView) else owner
    if not isinstance(owner, ir.Operation):
        return None
    name = owner.name
    if name == "torch.prim.ListConstruct" and depth == 0:
        items = list(owner.operands)
        if items and all(costs.parse_shaped(str(item.type)) is not None for item in items):
            return tuple(str(item.type) for item in items)
        return tuple(_constant_value(item, 1) for item in items)
    if not name.startswith("torch.constant.") or "value" not in owner.attributes:
        return None
    attr = owner.attributes["value"]
    if name == "torch.constant.str":
        return ir.StringAttr(attr).value
    if name == "torch.constant.bool":
        return ir.BoolAttr(attr).value
    if name == "torch.constant.int":
        return ir.IntegerAttr(attr).value
    return None


def _attributes(op: ir.Operation) -> dict[str, str]:
    if not op.name.startswith(_ATTRIBUTE_PREFIXES) or op.name.endswith(("const", "constant")):
        return {}
    # Never print a constant's payload (weights): only the small attributes rules read.
    return {name: str(op.attributes[name]) for name in op.attributes if name not in ("value", "values")}


_CONTRACTING_RE = re.compile(r"lhs_contracting_dimensions = \[([0-9, ]*)\]")


def _dot_contraction(op: ir.Operation, operands: list[dict]) -> int | None:
    """Contracted length of a ``stablehlo.dot_general`` from ``dot_dimension_numbers``."""
    if op.name != "stablehlo.dot_general" or "dot_dimension_numbers" not in op.attributes or not operands:
        return None
    match = _CONTRACTING_RE.search(str(op.attributes["dot_dimension_numbers"]))
    shape = operands[0].get("shape")
    if match is None or not shape:
        return None
    dims = [int(d) for d in match.group(1).replace(" ", "").split(",") if d]
    if any(shape[d] is None for d in dims):
        return None
    return math.prod(shape[d] for d in dims)


@paused_gc()
def operator_table(tagged: list[TaggedOp[ir.Operation]], cache: LocationCache) -> tuple[list[dict], list[dict]]:
    """Operators and tensors of the tagged source module."""
    id_of = {item.op: item.id for item in tagged}
    value_ids = _value_ids(tagged)
    # Consumers from the operand side: ``value.uses`` hands out each user as an OpView,
    # and for a dialect without Python bindings (torch) every one retries the import.
    consumers_of: dict[ir.Value, set[str]] = {}
    for item in tagged:
        for operand in item.op.operands:
            consumers_of.setdefault(operand, set()).add(item.id)
    operators: list[dict] = []
    tensors: list[dict] = []
    loops = LoopTrips()
    callees: dict[str, str] = {}
    for item in tagged:
        op = item.op
        if op.name in frontends.CALL_OPS and "callee" in op.attributes:
            callees[item.id] = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
        loc = locations.strip_dfit(cache.loc(op.location))
        info = locations.source_info(loc)
        operands = [_value_info(value) for value in op.operands]
        result_values = list(op.results)
        results = [_value_info(value) for value in result_values]
        space, reduction, body_ops, accumulates = region_costs.structured_loops(op)
        kind = mlir_engine.display_name(op)
        cost = costs.op_cost(
            kind,
            [entry["type"] for entry in operands],
            [entry["type"] for entry in results],
            body_ops=body_ops,
            iteration_space=space,
            reduction=reduction,
            contraction=_dot_contraction(op, operands),
            multiply_accumulate=accumulates if space is not None else None,
            constants=_constants(op),
            attributes=_attributes(op),
            body_transcendentals=region_costs.body_transcendentals(op),
        )
        in_loop, trips = loops.trips_of(op)
        parent = op.parent
        operators.append(
            {
                "id": item.id,
                "hash": item.hash,
                "op": kind,
                "parent": id_of.get(parent) if parent is not None else None,
                "operands": operands,
                "results": results,
                "macs": cost.macs,
                "flops": cost.flops,
                "bytes": cost.bytes,
                # Elementwise transcendental evaluations (exp, tanh, ...), not in flops.
                "transcendentals": cost.transcendentals,
                # What the op does (dfit_mlir.core.costs): contraction, arithmetic, data, unknown.
                "cost_kind": cost.kind,
                # Inside a loop the figures are per trip; ``trips``: how many (the product
                # over the enclosing loops), None where a trip count is not static.
                "per_trip": in_loop,
                "trips": trips,
                "source": _file_loc(info.file_loc),
                "name_path": list(info.name_path),
                "call_stack": [_file_loc(frame) for frame in info.call_stack],
                # Filled by the frontend (dfit_mlir.frontends.annotate) below.
                **frontends.SourceModel().as_fields(),
            }
        )
        if op.name in CARRYING_OPS:
            operators[-1]["carried"] = _carried(item.id, op, value_ids, consumers_of)
        values = [(f"{item.id}:{number}", value, entry)
                  for number, (value, entry) in enumerate(zip(result_values, results, strict=True))]
        if mlir_engine.symbol_name(op) is not None and op.regions and op.regions[0].blocks:
            arguments = op.regions[0].blocks[0].arguments
            values += [(ids.argument_id(item.id, index), arg, _value_info(arg)) for index, arg in enumerate(arguments)]
        for tensor_id, value, entry in values:
            if "shape" not in entry:
                continue
            consumers = sorted(consumers_of.get(value, ()))
            tensors.append(
                {
                    "id": tensor_id,
                    "producer": item.id,
                    "consumers": consumers,
                    "shape": entry["shape"],
                    "dtype": entry["dtype"],
                    "bytes": entry["bytes"],
                }
            )
    loop_trips.through_calls(operators, callees)
    frontends.annotate(operators, callees, tensors=tensors)
    return operators, tensors


#: Loops whose regions' entry blocks take the op's operands one for one (the loop state):
#: their ``carried`` field says where each operand goes inside.
CARRYING_OPS = frozenset({"stablehlo.while", "mhlo.while", "scf.while"})


def _value_ids(tagged: list[TaggedOp[ir.Operation]]) -> dict[ir.Value, str]:
    """Each value's name in the manifest: ``op:N`` results, ``fn/argN`` function
    arguments, ``loop/carriedN`` the block arguments of a :data:`CARRYING_OPS` loop."""
    names: dict[ir.Value, str] = {}
    for item in tagged:
        op = item.op
        for number, value in enumerate(op.results):
            names[value] = f"{item.id}:{number}"
        if mlir_engine.symbol_name(op) is not None and op.regions and op.regions[0].blocks:
            for index, argument in enumerate(op.regions[0].blocks[0].arguments):
                names[argument] = ids.argument_id(item.id, index)
        elif op.name in CARRYING_OPS:
            for argument in _loop_arguments(op):
                names[argument[1]] = f"{item.id}/carried{argument[0]}"
    return names


def _loop_arguments(op: ir.Operation) -> list[tuple[int, ir.Value]]:
    """(operand index, block argument) of every region whose entry block takes the
    loop's operands one for one."""
    count = len(op.operands)
    return [(index, argument) for region in op.regions if region.blocks
            for index, argument in enumerate(region.blocks[0].arguments) if len(region.blocks[0].arguments) == count]


def _carried(op_id: str, op: ir.Operation, value_ids: dict[ir.Value, str],
             consumers_of: dict[ir.Value, set[str]]) -> list[dict[str, Any]]:
    """Per operand of a loop: the value passed (``operand``: its manifest name), the
    name of the loop state it becomes (``id``) and the ops inside that use it: the
    edges the tensor table cannot hold, as block arguments are not tensors there
    (inputs follow a token id through a decode loop with them)."""
    uses: dict[int, set[str]] = {}
    for index, argument in _loop_arguments(op):
        uses.setdefault(index, set()).update(consumers_of.get(argument, ()))
    return [{"id": f"{op_id}/carried{index}", "operand": value_ids.get(operand),
             "consumers": sorted(uses.get(index, ()))} for index, operand in enumerate(op.operands)]


def _file_loc(loc: locations.FileLoc | None) -> dict | None:
    return None if loc is None else {"file": loc.file, "line": loc.line, "col": loc.col}
