"""op-histogram: how many ops of each kind the model has, and how many events of each kind
the run recorded. A dfit analysis tool distributed as its own package; dfit finds it
through the ``dfit.tools`` entry point in this package's ``pyproject.toml``.

Output: ``histogram.csv`` with columns ``what`` (``op`` or ``event``), ``kind`` (the full
op name, ``linalg.matmul``, or the event kind, ``dispatch``) and ``count``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from dfit_mlir.analysis.tools import Tool, ToolContext


class OpHistogram(Tool):
    name = "op-histogram"
    description = "Ops per kind and events per kind (example plugin)."

    def on_init(self, ctx: ToolContext) -> None:
        ctx.state["events"] = Counter()

    def on_event(self, ctx: ToolContext, batch: Any) -> None:
        # One batch is a pyarrow RecordBatch of the event schema; ``kind`` is its event kind.
        ctx.state["events"].update(batch.column("kind").to_pylist())

    def on_shutdown(self, ctx: ToolContext) -> None:
        ops = Counter(op.op for op in ctx.operators())
        events = ctx.state["events"]
        rows = [{"what": "op", "kind": kind, "count": count} for kind, count in sorted(ops.items())]
        rows += [{"what": "event", "kind": kind, "count": count} for kind, count in sorted(events.items())]
        ctx.export_table("histogram", rows)
        ctx.state["totals"] = (sum(ops.values()), len(ops), sum(events.values()), len(events))

    def report(self, ctx: ToolContext) -> str:
        ops, op_kinds, events, event_kinds = ctx.state.get("totals", (0, 0, 0, 0))
        return f"{ops} ops of {op_kinds} kinds, {events} events of {event_kinds} kinds"
