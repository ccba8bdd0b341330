"""How many times an op runs per call of the model, where the source says it statically:
the trip counts of the loops around it (``scf.for``, ``scf.while``, ``stablehlo.while``
from ``lax.scan``/``fori_loop``), through the private functions a loop body calls.

An op's static costs (:mod:`dfit_mlir.core.costs`) are per execution, so inside a loop they
are *per trip*; the manifest says so (``per_trip``) and gives ``trips``, the number of
executions per call of the model: the product of the trip counts of its enclosing
loops, summed over the call sites of its function. ``None`` where one of those loops
has no static trip count: its figures stay per trip. Counting from the run's dispatch
events is the ledger's job; this is the static side.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from iree.compiler import ir

LOOP_OPS = frozenset({"scf.for", "scf.while", "stablehlo.while", "mhlo.while", "torch.prim.Loop"})
_SCALAR = re.compile(r"^(?:dense<)?(?P<value>-?\d+)>?\s*:")
_COMPARISON = re.compile(r"comparison_direction\s+(?P<dir>[A-Z]+)|predicate = (?P<pred>\d+)")


class LoopTrips:
    """Trip counts of the loops around an op (cached per loop op)."""

    def __init__(self) -> None:
        self._loop: dict[Any, int | None] = {}

    def trips_of(self, op: ir.Operation) -> tuple[bool, int | None]:
        """(whether a loop encloses ``op`` lexically, the product of their trip counts or
        None if one is not static; 1 outside any loop)."""
        in_loop, trips = False, 1
        parent = op.parent
        while parent is not None:
            parent = parent.operation if isinstance(parent, ir.OpView) else parent
            if parent.name in LOOP_OPS:
                in_loop = True
                if parent not in self._loop:
                    self._loop[parent] = loop_trip_count(parent)
                count = self._loop[parent]
                trips = None if trips is None or count is None else trips * count
            parent = parent.parent
        return in_loop, trips


def _constant_int(value: ir.Value) -> int | None:
    owner = value.owner
    owner = owner.operation if isinstance(owner, ir.OpView) else owner
    if not isinstance(owner, ir.Operation) or owner.name not in ("arith.constant", "stablehlo.constant",
                                                                 "torch.constant.int"):
        return None
    match = _SCALAR.match(str(owner.attributes["value"]))
    return int(match["value"]) if match else None


def loop_trip_count(loop: ir.Operation) -> int | None:
    """Static trip count of one loop op, or None."""
    if loop.name == "scf.for":
        lower, upper, step = (_constant_int(v) for v in list(loop.operands)[:3])
        if None in (lower, upper, step) or step <= 0:  # type: ignore[operator]
            return None
        return max(0, -(-(upper - lower) // step))  # type: ignore[operator]
    if loop.name in ("stablehlo.while", "mhlo.while", "scf.while"):
        return _while_trip_count(loop)
    return None


def _while_trip_count(loop: ir.Operation) -> int | None:
    """``while (i < N) { …; i = i + step }`` with ``i`` starting at a constant: the
    counted loop ``lax.scan`` and ``fori_loop`` lower to."""
    cond = loop.regions[0].blocks[0]
    operations = list(cond.operations)
    terminator = operations[-1] if operations else None
    if terminator is None or not list(terminator.operands):
        return None
    decision = list(terminator.operands)[-1 if loop.name != "scf.while" else 0]
    compare = decision.owner
    compare = compare.operation if isinstance(compare, ir.OpView) else compare
    if not isinstance(compare, ir.Operation) or compare.name not in ("stablehlo.compare", "arith.cmpi"):
        return None
    text = " ".join(f"{name} = {compare.attributes[name]}" for name in ("comparison_direction", "predicate")
                    if name in compare.attributes)
    direction = _COMPARISON.search(text)
    if direction is None:
        return None
    # arith.cmpi predicates: 2 slt, 3 sle, 6 ult, 7 ule.
    less = direction["dir"] == "LT" or direction["pred"] in ("2", "6")
    less_equal = direction["dir"] == "LE" or direction["pred"] in ("3", "7")
    if not (less or less_equal):
        return None
    counter, bound = list(compare.operands)[:2]
    limit = _constant_int(bound)
    counter = counter.maybe_downcast()
    if limit is None or not isinstance(counter, ir.BlockArgument):
        return None
    position = counter.arg_number
    start = _constant_int(list(loop.operands)[position]) if position < len(list(loop.operands)) else None
    step = _body_step(loop, position)
    if start is None or step is None or step <= 0:
        return None
    span = limit - start + (1 if less_equal else 0)
    return max(0, -(-span // step))


def _body_step(loop: ir.Operation, position: int) -> int | None:
    """The constant the body adds to loop-carried value ``position``."""
    body = loop.regions[1].blocks[0]
    yielded = list(list(body.operations)[-1].operands)
    if position >= len(yielded):
        return None
    owner = yielded[position].owner
    owner = owner.operation if isinstance(owner, ir.OpView) else owner
    if not isinstance(owner, ir.Operation) or owner.name not in ("stablehlo.add", "arith.addi"):
        return None
    operands = list(owner.operands)
    argument = body.arguments[position]
    others = [v for v in operands if v != argument]
    return _constant_int(others[0]) if len(others) == 1 else None


def through_calls(operators: Sequence[dict[str, Any]], callees: Mapping[str, str]) -> None:
    """Ops of a private function a loop body calls run as often as its call sites do:
    ``trips`` = own trips x the sum over call sites of theirs (None if one is None);
    ``per_trip`` if a call site is. In place."""
    by_id = {op["id"]: op for op in operators}
    callers: dict[str, list[str]] = {}
    for call_id, callee in callees.items():
        callers.setdefault(callee, []).append(call_id)
    function_of: dict[str, str | None] = {}

    def function(op_id: str) -> str | None:
        if op_id not in function_of:
            parent = by_id[op_id].get("parent")
            while parent is not None and parent in by_id and by_id[parent]["op"] != "func.func":
                parent = by_id[parent].get("parent")
            function_of[op_id] = parent
        return function_of[op_id]

    calls_of: dict[str, tuple[bool, int | None]] = {}

    def calls(name: str, seen: frozenset[str]) -> tuple[bool, int | None]:
        """(per trip, executions per model call) of function ``name``."""
        if name in calls_of:
            return calls_of[name]
        sites = callers.get(name, ())
        if not sites or name in seen:
            return False, 1
        per_trip, total = False, 0
        for site in sites:
            own = by_id[site]
            outer = function(site)
            outer_per_trip, outer_calls = calls(outer, seen | {name}) if outer else (False, 1)
            per_trip = per_trip or own.get("per_trip", False) or outer_per_trip
            trips = own.get("trips", 1)
            total = None if total is None or trips is None or outer_calls is None else total + trips * outer_calls
        calls_of[name] = (per_trip, total)
        return calls_of[name]

    for op in operators:
        name = function(op["id"])
        if name is None or name not in callers:
            continue
        per_trip, count = calls(name, frozenset())
        op["per_trip"] = op.get("per_trip", False) or per_trip
        op["trips"] = None if count is None or op.get("trips") is None else op["trips"] * count
