"""One copy of a JAX private helper per phase it runs in.

JAX lowers a helper it reuses (a jitted function, ``dynamic_index_in_dim`` slicing a
``lax.scan``'s stacked weights, ``_where``) to **one** private function and calls it from
every place it runs: the slicing helper of a scan is called from the forward loop
(``jit(step)/jvp(layers)/while/body/…``) and from the backward loop
(``jit(step)/transpose(jvp(layers))/while/body/…``). An op has one ID and one phase in
the manifest, so the ops of such a helper had none (their call sites disagree), and a
dispatch IREE inlined from the backward call was reported as neither forward nor
backward.

:func:`specialize_by_phase` gives each phase its own copy before dfit tags the module:
the calls of the first phase (in :data:`dfit_mlir.frontends.PHASES` order) keep the
function, the calls of each other phase call a clone named ``<helper>_<phase>``
(``dynamic_index_in_dim_0_backward``). The call sites' phases are read with the JAX
frontend's own rules (:func:`dfit_mlir.frontends.annotate`), and the copying repeats
until no helper is called from two phases, so a helper's own helpers follow it. IREE
inlines every private function at its call sites, so the executables do not change:
only the source ops are per phase, as the inlined copies were already, and each
copy's ops take the phase of its calls everywhere dfit reads one (ledger, analysis,
diff). Calls whose phase nothing says stay on the original function.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

#: ``call @name(`` in StableHLO text (``func.call`` and the short ``call`` form; a quoted
#: name such as ``@"<lambda>"`` too).
_CALL = re.compile(r'\bcall @("[^"]+"|[\w$.\-]+)\(')
#: Rounds of copying: a helper's helpers are split in the next round (nesting depth).
MAX_ROUNDS = 16


def specialize_by_phase(text: str, frontend: Any) -> str:
    """``text`` with every private function called from call sites of different phases
    copied once per phase (see the module docstring); ``text`` itself when none is.
    ``frontend``: the one whose rules read the call sites' phases (the JAX frontend)."""
    calls: defaultdict[str, int] = defaultdict(int)
    for match in _CALL.finditer(text):
        calls[match.group(1)] += 1
    if not any(count > 1 for count in calls.values()):
        return text  # no function is called twice: nothing can be shared
    from iree.compiler import ir

    from dfit_mlir.passes import phases

    _, context = phases.compiler_context()
    with context, ir.Location.unknown(context):
        module = ir.Module.parse(text)
        changed = False
        for _ in range(MAX_ROUNDS):
            if not _split_once(module, frontend):
                break
            changed = True
        if not changed:
            return text
        return module.operation.get_asm(enable_debug_info=True)


def _split_once(module: Any, frontend: Any) -> bool:
    """One round: copy each private function whose call sites' phases differ; whether any was."""
    from iree.compiler import ir

    records, calls, functions = _call_site_records(module, frontend)
    phase_of = {record["id"]: record.get("phase") for record in records}
    by_callee: defaultdict[str, defaultdict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    for call_id, (callee, call) in calls.items():
        phase = phase_of.get(call_id)
        if phase is not None and callee in functions:
            by_callee[callee][phase].append(call)
    taken = set(functions)
    split = False
    for callee, groups in by_callee.items():
        if len(groups) < 2:
            continue
        ordered = sorted(groups, key=_phase_rank)
        for phase in ordered[1:]:
            name = _fresh_name(f"{callee}_{phase}", taken)
            taken.add(name)
            original = functions[callee]
            with ir.InsertionPoint.after(original):
                clone = original.clone()
            clone.attributes["sym_name"] = ir.StringAttr.get(name)
            for call in groups[phase]:
                call.attributes["callee"] = ir.FlatSymbolRefAttr.get(name)
            split = True
    return split


def _phase_rank(phase: str) -> tuple[int, str]:
    from dfit_mlir.frontends import PHASES

    return (PHASES.index(phase) if phase in PHASES else len(PHASES), phase)


def _fresh_name(wanted: str, taken: set[str]) -> str:
    name, number = wanted, 1
    while name in taken:
        name, number = f"{wanted}_{number}", number + 1
    return name


def _call_site_records(module: Any, frontend: Any) -> tuple[list[dict[str, Any]], dict[str, tuple[str, Any]], dict[str, Any]]:
    """Operator records the frontend annotates (as :func:`passes.operators.operator_table`
    makes them, without costs or IDs: a function's ID is its symbol, other ops are
    numbered), the call ops (record ID → (callee, op)) and the private functions by name."""
    from iree.compiler import ir

    from dfit_mlir import frontends
    from dfit_mlir.core import locations
    from dfit_mlir.passes import mlir_engine

    tree = mlir_engine.OpTree(module.operation)
    id_of: dict[Any, str] = {}
    records: list[dict[str, Any]] = []
    calls: dict[str, tuple[str, Any]] = {}
    functions: dict[str, Any] = {}
    callees: dict[str, str] = {}
    cache: dict[Any, Any] = {}
    for number, op in enumerate(tree.walk()):
        symbol = mlir_engine.symbol_name(op)
        op_id = symbol if symbol is not None and op.name in frontends.FUNCTION_OPS else f"#{number}"
        id_of[op] = op_id
        if op.name in frontends.FUNCTION_OPS and symbol is not None and _is_private(op):
            functions[symbol] = op
        if op.name in frontends.CALL_OPS and "callee" in op.attributes:
            callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
            calls[op_id] = (callee, op)
            callees[op_id] = callee
        info = locations.source_info(locations.strip_dfit(mlir_engine.to_loc(op.location, cache)))
        parent = op.parent
        records.append({"id": op_id, "op": op.name, "parent": id_of.get(parent) if parent is not None else None,
                        "name_path": list(info.name_path), "call_stack": list(info.call_stack),
                        "source": info.file_loc})
    frontends.annotate(records, callees, frontend=frontend)
    return records, calls, functions


def _is_private(op: Any) -> bool:
    from iree.compiler import ir

    return "sym_visibility" in op.attributes and ir.StringAttr(op.attributes["sym_visibility"]).value == "private"
