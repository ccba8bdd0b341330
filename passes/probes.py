"""Function-boundary probes for ``lite`` instrumentation.

Every function with a body gets ``call @dfit.probe(site, edge)`` at entry (edge 0) and
before each return (edge 1). IREE turns the declaration into an optional import of a
module named ``dfit`` (calling convention ``0ii_v``): in this process
:mod:`dfit_mlir.runtime_hooks.probes` provides it and timestamps each call; anywhere
else (``iree-run-module``, a user's own runtime) the import is unresolved and the VM
calls the in-module fallback, so the same vmfb runs with or without the hook module.

Why ``(i32, i32)`` and not a tensor-carrying probe that would wait for the function's
results: in IREE 3.13 a ``vm.fallback`` whose signature holds a tensor or a
``!hal.buffer_view`` fails the bytecode verifier at load ("i32/f32 register required
but ref register provided"), and the Python binding segfaults on an i32 before a ref
(RUNTIME-NOTES.md). An ``(i32, i32)`` call runs in program order without waiting: on
``local-sync`` the end probe fires after the function's work; on ``local-task`` it
marks when the host finished issuing it (the caller then waits on the results, which
the ``program`` event's end covers).

The fallback holds a ``util.optimization_barrier`` on its argument: an empty fallback
is folded away by IREE and the import then references a missing symbol.

``dfit compile`` inserts them once IREE's input phase ran (``util.func``: the input
dialects are lowered, and ONNX imports, which reject new ``func.func``s without their
``torch.onnx_meta`` attributes, are past that check), after tagging and snapshots, so
they never take part in IDs; ``dfit opt``'s ``dfit-probes`` pass works on ``func.func``
too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the MLIR bindings cost ~110 MiB of RSS: the runtime side reads only the names above
    from iree.compiler import ir

#: Module and function the runtime hook provides (``dfit.probe`` → import ``dfit.probe``).
PROBE_MODULE = "dfit"
PROBE_FUNCTION = "probe"
#: ``iree-dump-module``'s calling convention for ``(i32, i32) -> ()``.
PROBE_CCONV = "0ii_v"
FALLBACK = "dfit_probe_fallback"
EDGES = ("begin", "end")

#: Function flavours: the source's ``func`` dialect, or IREE's ``util`` once the input
#: phase ran (where a ``dfit compile`` inserts them: ONNX imports would reject new
#: ``func.func``s that lack their ``torch.onnx_meta`` attributes).
_FLAVOURS = {
    "func.func": ("func.call", "func.return", "return"),
    "util.func": ("util.call", "util.return", "util.return"),
}


def _declarations(function_op: str) -> str:
    return_op = _FLAVOURS[function_op][2]
    return f"""
{function_op} private @{PROBE_MODULE}.{PROBE_FUNCTION}(i32, i32) attributes {{vm.fallback = @{FALLBACK}}}
{function_op} private @{FALLBACK}(%site: i32, %edge: i32) {{
  %kept = util.optimization_barrier %site : i32
  {return_op}
}}
"""


@dataclass(frozen=True)
class ProbeSite:
    """One probe call: ``site`` is the first i32 the hook receives."""

    site: int
    function: str
    edge: str


def insert_function_probes(module: ir.Operation) -> list[ProbeSite]:
    """Insert entry/exit probes in every function of ``module`` that has a body; returns
    the probe sites in site order (empty, and nothing inserted, if there is no such
    function or the module already has probes)."""
    from iree.compiler import ir

    body = module.regions[0].blocks[0]
    top_level = list(body.operations)
    if any(_symbol(op) == f"{PROBE_MODULE}.{PROBE_FUNCTION}" for op in top_level):
        return []
    functions = [op.operation for op in top_level
                 if op.operation.name in _FLAVOURS and len(op.operation.regions[0].blocks) > 0]
    if not functions:
        return []
    flavour = functions[0].name
    call_op, return_op, _ = _FLAVOURS[flavour]
    functions = [function for function in functions if function.name == flavour]
    context = module.context
    i32 = ir.IntegerType.get_signless(32, context)
    sites: list[ProbeSite] = []
    with context, ir.Location.name("dfit.probe"):
        declarations = ir.Module.parse(_declarations(flavour))
        for op in list(declarations.body.operations):
            op.operation.move_before(top_level[0].operation)
        for function in functions:
            name = _symbol(function) or "?"
            entry = function.regions[0].blocks[0]
            begin = len(sites)
            sites.append(ProbeSite(begin, name, "begin"))
            with ir.InsertionPoint.at_block_begin(entry):
                _call_probe(call_op, begin, 0, i32)
            for block in function.regions[0].blocks:
                terminator = list(block.operations)[-1].operation
                if terminator.name != return_op:
                    continue
                end = len(sites)
                sites.append(ProbeSite(end, name, "end"))
                with ir.InsertionPoint(terminator):
                    _call_probe(call_op, end, 1, i32)
    return sites


def _call_probe(call_op: str, site: int, edge: int, i32: ir.Type) -> None:
    from iree.compiler import ir

    site_value = ir.Operation.create("arith.constant", results=[i32],
                                     attributes={"value": ir.IntegerAttr.get(i32, site)}).result
    edge_value = ir.Operation.create("arith.constant", results=[i32],
                                     attributes={"value": ir.IntegerAttr.get(i32, edge)}).result
    ir.Operation.create(call_op, operands=[site_value, edge_value],
                        attributes={"callee": ir.FlatSymbolRefAttr.get(f"{PROBE_MODULE}.{PROBE_FUNCTION}")})


def _symbol(op: ir.Operation | ir.OpView) -> str | None:
    from iree.compiler import ir

    op = op.operation
    if "sym_name" not in op.attributes:
        return None
    return ir.StringAttr(op.attributes["sym_name"]).value
