"""The ID algorithm and the dfit encoding on the MLIR Python bindings bundled in
``iree.compiler`` — the engine used for IREE-scale work (it parses ~20x faster than xDSL).
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Hashable, Iterable, Iterator, Sequence

from iree.compiler import ir

from dfit_mlir.core import ids, locations
from dfit_mlir.core.locations import DFIT_NAME_PREFIX, Loc
from dfit_mlir.core.perf import paused_gc

DIALECT_PACKAGE = "iree.compiler.dialects"


def remember_missing_dialect_modules(dialects: Iterable[str]) -> None:
    """Record in ``sys.modules`` (as ``None``, Python's documented "no such module") the
    dialects of ``dialects`` that have no Python module in ``iree.compiler.dialects``.

    Each time the bindings hand out a value type or an op of such a dialect (``torch``
    from the ONNX importer), they try to import its module again and the failed search
    is not cached: 826 failed imports while tagging a 164-op squeezenet, 5% of its
    compile. A ``None`` entry makes each retry fail at once.
    """
    for dialect in dialects:
        name = f"{DIALECT_PACKAGE}.{dialect}"
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            sys.modules[name] = None  # type: ignore[assignment]


class OpTree:
    """The ops of each block under a root, from one native walk.

    Iterating ``block.operations`` makes an ``OpView`` per op, and the first op of each
    dialect imports that dialect's Python module (linalg's takes 0.16 s); the native walk
    hands out plain ``ir.Operation`` objects and is as fast. A post-order walk visits the
    ops of a block in order, after the ops nested in them.
    """

    def __init__(self, root: ir.Operation):
        self.root = root
        self._ops: dict[ir.Block, list[ir.Operation]] = {}

        def visit(op: ir.Operation) -> ir.WalkResult:
            if op != root:
                self._ops.setdefault(op.block, []).append(op)
            return ir.WalkResult.ADVANCE

        root.walk(visit, ir.WalkOrder.POST_ORDER)
        remember_missing_dialect_modules({op.name.split(".", 1)[0] for ops in self._ops.values() for op in ops})

    def ops_in(self, block: ir.Block) -> list[ir.Operation]:
        return self._ops.get(block, [])

    def children(self, op: ir.Operation) -> list[ir.Operation]:
        """Ops directly nested in ``op``'s regions, in order."""
        return [child for region in op.regions for block in region.blocks for child in self.ops_in(block)]

    def walk(self) -> Iterator[ir.Operation]:
        """Pre-order walk of every op under the root (the root excluded)."""
        stack = list(reversed(self.children(self.root)))
        while stack:
            op = stack.pop()
            yield op
            stack.extend(reversed(self.children(op)))


def walk_ops(root: ir.Operation) -> Iterator[ir.Operation]:
    """Pre-order walk of every op nested under ``root`` (``root`` excluded)."""
    return OpTree(root).walk()


def display_name(op: ir.Operation) -> str:
    """The op's name as IDs use it (:func:`dfit_mlir.core.ids.display_name`)."""
    name = op.name
    if name in ids.GENERIC_OPS and "name" in op.attributes:
        return ids.display_name(name, ir.StringAttr(op.attributes["name"]).value)
    return name


def symbol_name(op: ir.Operation) -> str | None:
    if "sym_name" in op.attributes:
        return ir.StringAttr(op.attributes["sym_name"]).value
    return None


class MlirEngine:
    """:class:`dfit_mlir.core.ids.IREngine` over ``iree.compiler.ir`` operations."""

    def __init__(self, tree: OpTree):
        self.tree = tree

    def op_name(self, op: ir.Operation) -> str:
        return display_name(op)

    def symbol_name(self, op: ir.Operation) -> str | None:
        return symbol_name(op)

    def signature(self, op: ir.Operation) -> str:
        attributes = op.attributes
        pairs = [(name, _attr_text(attributes[name])) for name in attributes]
        return ids.signature(pairs, (str(result.type) for result in op.results))

    def operand_keys(self, op: ir.Operation) -> Sequence[Hashable]:
        return list(op.operands)

    def result_keys(self, op: ir.Operation) -> Sequence[Hashable]:
        return list(op.results)

    def blocks(
        self, op: ir.Operation
    ) -> Iterable[tuple[Sequence[tuple[Hashable, str]], Sequence[ir.Operation]]]:
        for region in op.regions:
            for block in region.blocks:
                arguments = [(arg, str(arg.type)) for arg in block.arguments]
                yield arguments, self.tree.ops_in(block)


def _attr_text(attr: ir.Attribute) -> str:
    if isinstance(attr, ir.DenseElementsAttr | ir.DenseResourceElementsAttr):
        shaped = ir.ShapedType(attr.type)
        if not shaped.has_static_shape or _element_count(shaped.shape) > ids.MAX_HASHED_ELEMENTS:
            return f"elements<{attr.type}>"
    return str(attr)


def _element_count(shape: Sequence[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def to_loc(location: ir.Location, cache: dict | None = None) -> Loc:
    """Convert a bindings location into the engine-neutral tree of
    :mod:`dfit_mlir.core.locations`."""
    if cache is not None:
        key = location.attr
        found = cache.get(key)
        if found is None:
            found = cache[key] = to_loc(location)
        return found
    if isinstance(location, ir.NameLoc):
        child = location.child_loc
        child_loc = None if isinstance(child, ir.UnknownLoc) else to_loc(child)
        return locations.NameLoc(location.name_str, child_loc)
    if isinstance(location, ir.FileLineColLoc):
        return locations.FileLoc(location.filename, location.start_line, location.start_col)
    if isinstance(location, ir.CallSiteLoc):
        return locations.CallSiteLoc(to_loc(location.callee), to_loc(location.caller))
    if isinstance(location, ir.FusedLoc):
        return locations.FusedLoc(tuple(to_loc(item) for item in location.locations))
    return locations.UNKNOWN


def original_location(location: ir.Location) -> ir.Location:
    """The location below any dfit NameLoc wrappers (so re-tagging never nests them)."""
    while isinstance(location, ir.NameLoc) and location.name_str.startswith(DFIT_NAME_PREFIX):
        location = location.child_loc
    return location


@paused_gc()
def tag_module(module: ir.Operation) -> list[ids.TaggedOp[ir.Operation]]:
    """Stamp ``dfit.id`` / ``dfit.hash`` attributes and a ``dfit:<id>`` NameLoc wrapping
    the original location on every op below ``module``; returns what was stamped."""
    engine = MlirEngine(OpTree(module))
    tagged = ids.assign_ids(engine, module)
    context = module.context
    for item in tagged:
        op = item.op
        op.attributes[ids.ID_ATTR] = ir.StringAttr.get(item.id, context)
        op.attributes[ids.HASH_ATTR] = ir.StringAttr.get(item.hash, context)
        op.location = ir.Location.name(
            DFIT_NAME_PREFIX + item.id, original_location(op.location), context
        )
        if symbol_name(op) is not None and op.regions and op.regions[0].blocks:
            # Function arguments: IREE builds the ABI import ops from their locations.
            for index, argument in enumerate(op.regions[0].blocks[0].arguments):
                argument.set_location(
                    ir.Location.name(DFIT_NAME_PREFIX + ids.argument_id(item.id, index),
                                     original_location(argument.location), context)
                )
    return tagged


def strip_dfit_attributes(module: ir.Operation) -> int:
    """Remove every discardable ``dfit.*`` attribute (IDs stay in the locations) so that
    IREE deduplicates executables exactly as in a plain compile; returns how many."""
    removed = 0
    for op in OpTree(module).walk():
        attributes = op.attributes
        for name in [name for name in attributes if name.startswith("dfit.")]:
            del attributes[name]
            removed += 1
    return removed


def dfit_tag_pass(op: ir.Operation, pass_: object) -> None:
    """``dfit-tag`` as a Python-defined pass for ``iree.compiler.passmanager``."""
    tag_module(op.operation)
