"""Lineage snapshot of a module after one IREE phase (MLIR bindings).

One walk over every op: the source IDs its location names, and the dispatch structure —
dispatch regions before outlining, executable exports with the IDs of their bodies, and
dispatch call sites in host code in program order with the export they call.
"""

from __future__ import annotations

import time

from iree.compiler import ir

from dfit_mlir.core import locations
from dfit_mlir.core.lineage import DispatchRegion, DispatchSite, Export, StageFigures
from dfit_mlir.core.perf import paused_gc
from dfit_mlir.passes.mlir_engine import OpTree, symbol_name, to_loc
from dfit_mlir.passes.region_costs import RegionCost, region_cost
from dfit_mlir.passes.stage_ir import StageIR

REGION_KINDS = frozenset({"flow.dispatch.workgroups", "flow.dispatch.region"})
EXPORT_KINDS = frozenset({"hal.executable.export", "stream.executable.export", "flow.executable.export"})
EXECUTABLE_KINDS = frozenset({"hal.executable", "stream.executable", "flow.executable"})
SITE_KINDS = frozenset({"hal.command_buffer.dispatch", "hal.command_buffer.dispatch.indirect", "stream.cmd.dispatch", "flow.dispatch"})
FUNCTION_KINDS = frozenset({"func.func", "util.func", "util.initializer", "vm.func", "vm.initializer"})


class LocationCache:
    """Source IDs per location, shared by every snapshot of one compile: locations are
    uniqued in the context, and most survive several phases unchanged."""

    def __init__(self) -> None:
        self._ids: dict[ir.Attribute, tuple[str, ...]] = {}
        self._locs: dict[ir.Attribute, locations.Loc] = {}

    def loc(self, location: ir.Location) -> locations.Loc:
        return to_loc(location, self._locs)

    def ids(self, location: ir.Location) -> tuple[str, ...]:
        key = location.attr
        found = self._ids.get(key)
        if found is None:
            found = self._ids[key] = locations.dfit_ids(to_loc(location, self._locs))
        return found


def symbol_path(attr: ir.Attribute) -> list[str]:
    """``@a::@b::@c`` → ``["a", "b", "c"]``: the names as data, read from the attribute, not
    its text (``@"we\\22ird<name>"`` is ``we"ird<name>``; a quoted name may hold ``::``)."""
    return [str(part) for part in ir.SymbolRefAttr(attr).value]


def _site_target(op: ir.Operation) -> tuple[str, str] | None:
    """(executable, export) that a dispatch call site runs."""
    attributes = op.attributes
    for name in ("entry_points", "entry_point"):
        if name in attributes:
            attr = attributes[name]
            first = ir.ArrayAttr(attr)[0] if isinstance(attr, ir.ArrayAttr) else attr
            path = symbol_path(first)
            return path[0], path[-1]
    for operand in op.operands:  # hal: [%function_id] from hal.executable.lookup.function
        owner = operand.owner
        owner = owner.operation if isinstance(owner, ir.OpView) else owner
        if isinstance(owner, ir.Operation) and owner.name == "hal.executable.lookup.function":
            path = symbol_path(owner.attributes["entry_point"])
            return path[0], path[-1]
    return None


@paused_gc()
def take_snapshot(module: ir.Operation, stage: str, cache: LocationCache,
                  carrier_texts: StageIR | None = None) -> StageFigures:
    """``carrier_texts``: also keep the printed IR of each ID's carriers (same walk)."""
    start = time.perf_counter()
    tree = OpTree(module)
    recording = carrier_texts.begin(module, stage, tree) if carrier_texts is not None else None
    figures = StageFigures(stage)
    export_ops: list[tuple[str, ir.Operation]] = []
    body_ids: dict[tuple[str, str], set[str]] = {}
    regions: list[tuple[str, tuple[str, ...], set[str], RegionCost]] = []  # function, root IDs, body IDs, cost

    # Iterative pre-order walk; each entry carries the enclosing function, executable, the
    # id-set collecting a dispatch region's or executable function's body (or None), and
    # whether a tagged non-symbol op encloses it.
    # ``around``: the IDs the ops around it carry (for ``recording`` only).
    stack: list[tuple[ir.Operation, str, str, set[str] | None, bool, frozenset[str]]] = [
        (module, "", "", None, False, frozenset())]
    while stack:
        op, function, executable, collector, enclosed, around = stack.pop()
        kind = op.name
        ids = cache.ids(op.location) if op is not module else ()
        if op is not module:
            figures.add(kind, ids, enclosed)
            if collector is not None:
                collector.update(ids)
            if recording is not None:
                around = recording.visit(op, kind, ids, around)
        if kind in FUNCTION_KINDS:
            function = symbol_name(op) or function
            if executable:
                collector = body_ids.setdefault((executable, function), set())
        elif kind in EXECUTABLE_KINDS:
            executable = symbol_name(op) or executable
        elif kind in EXPORT_KINDS:
            export_ops.append((executable, op))
        elif kind in SITE_KINDS:
            target = _site_target(op)
            if target is not None:
                figures.sites.append(DispatchSite(function, target[0], target[1], ids))
        elif kind in REGION_KINDS:
            collector = set(ids)
            regions.append((function, ids, collector, region_cost(op, cache.ids, tree)))
        if op.regions:
            enclosed = enclosed or (bool(ids) and "sym_name" not in op.attributes)
        children = [(child, function, executable, collector, enclosed, around) for child in tree.children(op)]
        stack.extend(reversed(children))
    if recording is not None:
        recording.finish()

    for function, root_ids, collected, cost in regions:
        figures.regions.append(DispatchRegion(function, root_ids, _ordered(root_ids, collected), cost))
    for executable, op in export_ops:
        name = symbol_name(op) or ""
        ordinal = None
        if "ordinal" in op.attributes:
            ordinal = ir.IntegerAttr(op.attributes["ordinal"]).value
        ids = cache.ids(op.location)
        figures.exports.append(Export(executable, name, ordinal, ids, _ordered(ids, body_ids.get((executable, name), set()))))
    figures.time_s = time.perf_counter() - start
    return figures


def _ordered(first: tuple[str, ...], rest: set[str]) -> tuple[str, ...]:
    """``first`` in order, then the rest sorted: deterministic output for a set."""
    return first + tuple(sorted(rest.difference(first)))
