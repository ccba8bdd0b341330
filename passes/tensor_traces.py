"""``--tensors FILTER``: trace the value each selected source op produces.

After IREE's ``input`` phase (input dialects lowered to linalg/tensor, every op still
carrying its ``dfit:<id>`` location), the last op of each selected ID in program order
gets ``flow.tensor.trace "dfit:<id>" = [%result : tensor<...>]`` right after it. The
runtime's ``HalModuleDebugSink`` receives ``("dfit:<id>", [buffer view])`` per
invocation (``runtime_hooks/tensors.py``).

Unlike IDs and probes, tracing is not observational: a trace reads the value between
dispatches, so the traced ops cannot fuse with their consumers and the module waits
for each traced dispatch (RUNTIME-NOTES.md: ≈3.5 µs per trace on local-sync, 45 µs on
local-task, before copying). Hence the filter, and runtime sampling.

The filter is a comma-separated list of globs (``dfit_mlir/core/filters.py``), matched
ignoring case against every name of the source op — its ID (``main/linalg.matmul#*``),
its op as the frontend names it (``onnx.Softmax``, ``torch.aten.softmax``,
``tosa.conv2d``), its module path — and against the lowered op it is after the input
phase (``linalg.conv_2d*``). A glob that selects no traceable op is an error naming the
closest names. Constants are never traced (they are weights, and the manifest has their
shapes), nor is ``tensor.empty`` (no values), nor anything inside an op's body
(scalars). Dynamic dimensions are passed to the trace as ``tensor.dim`` values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dfit_mlir.core import filters, lineage, locations

if TYPE_CHECKING:  # the MLIR bindings cost ~110 MiB of RSS: a run reads only KEY_PREFIX
    from iree.compiler import ir

KEY_PREFIX = "dfit:"
#: ``tensor.empty`` holds no values: tracing it would show uninitialised memory.
UNTRACED_OPS = frozenset({"tensor.empty"})
FUNCTION_OPS = frozenset({"func.func", "util.func"})


@dataclass(frozen=True)
class TensorTrace:
    key: str
    id: str
    op: str
    type: str


@dataclass(frozen=True)
class TracePlan:
    traces: tuple[TensorTrace, ...]
    #: IDs that matched but whose value cannot be traced, with the reason.
    skipped: tuple[tuple[str, str], ...]


def parse_filter(text: str) -> tuple[str, ...]:
    """The globs of a ``--tensors`` value (:class:`dfit_mlir.core.filters.FilterMatchesNothing`
    when it has none)."""
    return filters.NameFilter.parse(text, "--tensors").patterns


#: Said when a glob selects nothing: what it could not have selected anyway.
NEVER_TRACED = "constants, tensor.empty and ops inside another op's body are never traced"


def insert_tensor_traces(module: ir.Operation, patterns: tuple[str, ...],
                         names: Mapping[str, tuple[str, ...]] | None = None, where: str = "the module") -> TracePlan:
    """Insert one trace per selected ID (see the module docstring). ``names``: each
    source ID's names (:func:`dfit_mlir.core.filters.names_by_id` of the manifest's
    operators); without it, the ID and its op name."""
    from iree.compiler import ir

    from dfit_mlir.passes import mlir_engine

    selection = filters.NameFilter(tuple(patterns), "--tensors")
    last_op_of: dict[str, ir.Operation] = {}
    used: set[str] = set()
    vocabulary: list[tuple[str, ...]] = []
    for op in mlir_engine.walk_ops(module):
        if not op.results or op.name in UNTRACED_OPS or lineage.is_constant(op.name):
            continue
        if op.parent is None or op.parent.name not in FUNCTION_OPS:
            continue  # ops inside a linalg body compute scalars
        own = locations.dfit_ids(mlir_engine.to_loc(op.location))
        if len(own) != 1:
            continue
        (source_id,) = own
        candidate = (*((names or {}).get(source_id) or filters.id_names(source_id)), op.name)
        vocabulary.append(candidate)
        hit = selection.patterns_matching(candidate)
        if hit:
            used |= hit
            last_op_of[source_id] = op
    selection.require_all_used(used, vocabulary, where, NEVER_TRACED)
    traces: list[TensorTrace] = []
    skipped: list[tuple[str, str]] = []
    for source_id, op in last_op_of.items():
        value = op.results[0]
        if not isinstance(value.type, ir.RankedTensorType):
            skipped.append((source_id, f"result is {value.type}, not a ranked tensor"))
            continue
        key = KEY_PREFIX + source_id
        with op.location, ir.InsertionPoint.after(op):
            dims = _dynamic_dims(value)
            ir.Operation.create(
                "flow.tensor.trace",
                operands=[value, *dims],
                attributes={"key": ir.StringAttr.get(key),
                            "operandSegmentSizes": ir.DenseI32ArrayAttr.get([1, len(dims)])},
            )
        traces.append(TensorTrace(key, source_id, op.name, str(value.type)))
    return TracePlan(tuple(traces), tuple(skipped))


def _dynamic_dims(value: ir.Value) -> list[ir.Value]:
    """``tensor.dim`` of each dynamic dimension: ``flow.tensor.trace`` takes them as
    operands (``[%v : tensor<?x4xf32>{%d0}]``)."""
    from iree.compiler import ir

    shaped = ir.RankedTensorType(value.type)
    index = ir.IndexType.get()
    dims = []
    for axis in range(shaped.rank):
        if not shaped.is_dynamic_dim(axis):
            continue
        position = ir.Operation.create("arith.constant", results=[index],
                                       attributes={"value": ir.IntegerAttr.get(index, axis)}).result
        dims.append(ir.Operation.create("tensor.dim", results=[index], operands=[value, position]).result)
    return dims

